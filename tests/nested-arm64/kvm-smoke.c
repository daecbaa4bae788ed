// arm64 KVM smoke for the nested probe (probe.sh, issue 15): one vCPU,
// KVM_ARM_VCPU_INIT with the preferred target and PSCI 0.2, PC set through
// KVM_SET_ONE_REG; it runs four instructions (movz x0, #0x1000, lsl #16;
// movz x1, #42; str x1, [x0]; b .) and must exit with KVM_EXIT_MMIO, a
// write of 42 to 0x10000000. Prints one KVMPROBE line: PASS or FAIL.
#include <fcntl.h>
#include <linux/kvm.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define RAM_GPA 0x80000000UL
#define MMIO_GPA 0x10000000UL

static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
#define CHECK(x, what) do { if ((x) < 0) { printf("KVMPROBE FAIL "); fflush(stdout); perror(what); return 1; } } while (0)

int main(void) {
    double t0 = now_ms();
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC); CHECK(kvm, "open /dev/kvm");
    int vm = ioctl(kvm, KVM_CREATE_VM, 0); CHECK(vm, "KVM_CREATE_VM");
    size_t size = 0x10000;
    uint32_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) { perror("mmap guest memory"); return 1; }
    uint32_t code[] = {0xD2A20000, 0xD2800541, 0xF9000001, 0x14000000};
    memcpy(mem, code, sizeof code);
    struct kvm_userspace_memory_region r = {.slot = 0, .guest_phys_addr = RAM_GPA, .memory_size = size, .userspace_addr = (uint64_t)mem};
    CHECK(ioctl(vm, KVM_SET_USER_MEMORY_REGION, &r), "KVM_SET_USER_MEMORY_REGION");
    int vcpu = ioctl(vm, KVM_CREATE_VCPU, 0); CHECK(vcpu, "KVM_CREATE_VCPU");
    struct kvm_vcpu_init init; CHECK(ioctl(vm, KVM_ARM_PREFERRED_TARGET, &init), "KVM_ARM_PREFERRED_TARGET");
    init.features[0] |= 1 << KVM_ARM_VCPU_PSCI_0_2;
    CHECK(ioctl(vcpu, KVM_ARM_VCPU_INIT, &init), "KVM_ARM_VCPU_INIT");
    uint64_t pc = RAM_GPA;
    struct kvm_one_reg reg = {.id = KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | (offsetof(struct kvm_regs, regs.pc) / 4), .addr = (uint64_t)&pc};
    CHECK(ioctl(vcpu, KVM_SET_ONE_REG, &reg), "KVM_SET_ONE_REG pc");
    struct kvm_reg_list probe = {.n = 0};
    ioctl(vcpu, KVM_GET_REG_LIST, &probe);  // E2BIG, fills n
    int mmap_size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0); CHECK(mmap_size, "KVM_GET_VCPU_MMAP_SIZE");
    struct kvm_run *run = mmap(NULL, mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
    if (run == MAP_FAILED) { perror("mmap kvm_run"); return 1; }
    double t1 = now_ms();
    CHECK(ioctl(vcpu, KVM_RUN, 0), "KVM_RUN");
    double t2 = now_ms();
    if (run->exit_reason != KVM_EXIT_MMIO || run->mmio.phys_addr != MMIO_GPA || !run->mmio.is_write || run->mmio.data[0] != 42) {
        printf("KVMPROBE FAIL exit_reason %u addr %llx\n", run->exit_reason, (unsigned long long)run->mmio.phys_addr);
        return 1;
    }
    printf("KVMPROBE PASS target %u, %llu registers in KVM_GET_REG_LIST, setup %.2f ms, first KVM_RUN to the MMIO exit %.2f ms\n",
           init.target, (unsigned long long)probe.n, t1 - t0, t2 - t1);
    return 0;
}

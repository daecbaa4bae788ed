// The `jailer` mode: firecracker-go-sdk's own JailerCfg starts spore under
// spore's jailer, as a Firecracker user runs Firecracker jailed. The SDK execs
// -jailer (a `jailer` symlink to spore) with -exec-file (spore, named
// `firecracker`), the uid/gid, the NUMA node (the SDK turns it into
// `--cgroup cpuset.mems=N --cgroup cpuset.cpus=<the node's cpus>`) and the
// cgroup version; its NaiveChrootStrategy links the kernel and the root drive
// into the jail. The guest is a spore unikernel that prints `count N` lines,
// which the VMM's stdout (-out) collects.
//
// Steps print `SPORE-TEST <name> PASS|FAIL [detail]` lines. After the guest
// runs, `SPORE-JAILED pid=<VMM pid>` is printed and the program waits for a
// line on stdin, so that the caller can inspect the jailed VMM; then it
// pauses, resumes and stops the VM.
//
//	fc-sdk jailer -jailer BIN -exec-file BIN -kernel IMG -drive IMG -base DIR -id ID -out FILE
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"
)

// countLines is how many `count N` lines the guest has printed so far.
func countLines(out string) int {
	b, err := os.ReadFile(out)
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "count ") {
			n++
		}
	}
	return n
}

// countsPast waits until the guest printed more than `after` count lines.
func countsPast(out string, after int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if n := countLines(out); n > after {
			return n, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("no count line past %d within %s", after, within)
}

func jailerMain(args []string) {
	fs := flag.NewFlagSet("jailer", flag.ExitOnError)
	jailerBin := fs.String("jailer", "", "the jailer binary (a `jailer` symlink to spore)")
	execFile := fs.String("exec-file", "", "the VMM binary the jailer copies and execs")
	kernel := fs.String("kernel", "", "the guest kernel (a spore unikernel image)")
	drive := fs.String("drive", "", "the root drive (the SDK's jailer mode wants one)")
	base := fs.String("base", "", "the chroot base directory")
	id := fs.String("id", "", "the microVM's id")
	out := fs.String("out", "", "the file the VMM's stdout goes to")
	uid := fs.Int("uid", 123, "the VMM's uid")
	gid := fs.Int("gid", 100, "the VMM's gid")
	numa := fs.Int("numa-node", 0, "the NUMA node")
	version := fs.String("cgroup-version", "1", "the cgroup version (JailerCfg.CgroupVersion)")
	bootArgs := fs.String("boot-args", "", "the kernel command line")
	if err := fs.Parse(args); err != nil {
		must("flags", err, "")
	}

	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	logger.SetOutput(os.Stderr)
	log := logrus.NewEntry(logger)

	vmmOut, err := os.Create(*out)
	must("vmm-output", err, *out)
	defer vmmOut.Close()

	cfg := firecracker.Config{
		KernelImagePath: *kernel,
		KernelArgs:      *bootArgs,
		Drives:          firecracker.NewDrivesBuilder(*drive).WithRootDrive(*drive, firecracker.WithReadOnly(true)).Build(),
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(64),
		},
		JailerCfg: &firecracker.JailerConfig{
			UID:            firecracker.Int(*uid),
			GID:            firecracker.Int(*gid),
			ID:             *id,
			NumaNode:       firecracker.Int(*numa),
			ExecFile:       *execFile,
			JailerBinary:   *jailerBin,
			ChrootBaseDir:  *base,
			ChrootStrategy: firecracker.NewNaiveChrootStrategy(*kernel),
			CgroupVersion:  *version,
			Stdout:         vmmOut,
			Stderr:         os.Stderr,
		},
	}
	ctx := context.Background() // the VMM lives until stop(); cancelling it would kill it
	m, err := firecracker.NewMachine(ctx, cfg, firecracker.WithLogger(log))
	must("sdk-new-machine", err, "")

	t0 := time.Now()
	err = m.Start(ctx)
	must("sdk-jailer-start", err, ms(t0)+", "+state(ctx, m))

	n, err := countsPast(*out, 2, 30*time.Second)
	must("guest-runs", err, fmt.Sprintf("%d count lines %s after start", n, ms(t0)))

	pid, err := m.PID()
	must("vmm-pid", err, "")
	fmt.Printf("SPORE-JAILED pid=%d\n", pid)
	// The caller inspects the jailed VMM, then answers one line.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		result("inspected", err, "stdin closed")
	}

	err = m.PauseVM(ctx)
	if err == nil && state(ctx, m) != models.InstanceInfoStatePaused {
		err = fmt.Errorf("state %s after PauseVM", state(ctx, m))
	}
	paused := countLines(*out)
	time.Sleep(300 * time.Millisecond)
	// A line the guest wrote just before the pause may land late; more is not paused.
	if now := countLines(*out); err == nil && now > paused+1 {
		err = fmt.Errorf("%d count lines while paused", now-paused)
	}
	must("pause", err, "")

	t0 = time.Now()
	err = m.ResumeVM(ctx)
	if err == nil && state(ctx, m) != models.InstanceInfoStateRunning {
		err = fmt.Errorf("state %s after ResumeVM", state(ctx, m))
	}
	if err == nil {
		_, err = countsPast(*out, countLines(*out), 30*time.Second)
	}
	must("resume", err, "guest counting again "+ms(t0)+" after ResumeVM")

	t0 = time.Now()
	result("stop", stop(m), ms(t0))
	if failed {
		os.Exit(1)
	}
}

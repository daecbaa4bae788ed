// fc-sdk drives spore through firecracker-go-sdk (the version pinned in
// go.mod) exactly as a Firecracker user would: the SDK's default launcher runs
// `firecracker` from PATH (a symlink to spore) with its own flags, configures
// a Linux guest over the API, starts it, pauses it, snapshots it, stops it,
// loads the snapshot in a new process with WithSnapshot, resumes it, checks
// the guest still answers, then drives the balloon.
//
// The guest (tests/nested/scenarios/guest/fc-sdk.sh) serves shell commands on
// vsock port 5000; this program reaches it through Firecracker's hybrid vsock
// (the host side is a Unix socket: "CONNECT <port>\n", then "OK <n>\n").
//
// Each step prints one `SPORE-TEST <name> PASS|FAIL [detail]` line for the
// nested harness. A failed step that later steps need ends the run (exit 1).
//
//	fc-sdk -kernel VMLINUX -initrd INITRAMFS -dir SCRATCH [-out DIR]
//	fc-sdk jailer ...   (jailer.go: the SDK's JailerCfg, on the host)
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"
)

const (
	guestPort  = 5000
	guestCID   = 3
	memMiB     = 256
	balloonMiB = 64
	cmdline    = "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
)

var failed bool

func result(name string, err error, detail string) {
	if err != nil {
		failed = true
		fmt.Printf("SPORE-TEST %s FAIL %s\n", name, oneLine(err.Error()+" "+detail))
		return
	}
	if detail != "" {
		fmt.Printf("SPORE-TEST %s PASS %s\n", name, oneLine(detail))
	} else {
		fmt.Printf("SPORE-TEST %s PASS\n", name)
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// must reports a step; a failure here leaves nothing for later steps to test.
func must(name string, err error, detail string) {
	result(name, err, detail)
	if err != nil {
		os.Exit(1)
	}
}

// guestRun sends one shell command to the guest over hybrid vsock and returns
// its output. It retries (the guest may still be booting or resuming) until
// the deadline.
func guestRun(uds, command string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		out, err := guestOnce(uds, command)
		if err == nil && out != "" {
			return out, nil
		}
		if err == nil {
			err = errors.New("empty answer")
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return "", fmt.Errorf("guest did not answer within %s: %v", within, last)
}

func guestOnce(uds, command string) (string, error) {
	c, err := net.DialTimeout("unix", uds, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// One connection carries one command; an accepted connection that never
	// answers must not hang the scenario.
	if err := c.SetDeadline(time.Now().Add(60 * time.Second)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", guestPort); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	ack, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("no CONNECT answer: %w", err)
	}
	if !strings.HasPrefix(ack, "OK ") {
		return "", fmt.Errorf("CONNECT answered %q", ack)
	}
	if _, err := fmt.Fprintf(c, "%s\nexit\n", command); err != nil {
		return "", err
	}
	out, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

func uptime(uds string, within time.Duration) (float64, error) {
	out, err := guestRun(uds, "cut -d' ' -f1 /proc/uptime", within)
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(out, 64)
}

// memTotalKiB is the guest's MemTotal: without deflate-on-oom, Linux's
// virtio-balloon driver takes inflated pages out of it.
func memTotalKiB(uds string) (int64, error) {
	out, err := guestRun(uds, "awk '/^MemTotal:/ {print $2}' /proc/meminfo", 30*time.Second)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(out, 10, 64)
}

func state(ctx context.Context, m *firecracker.Machine) string {
	info, err := m.DescribeInstanceInfo(ctx)
	if err != nil || info.State == nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return *info.State
}

// stop ends the VMM the SDK's way (SIGTERM) and waits for the process.
func stop(m *firecracker.Machine) error {
	if err := m.StopVMM(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := m.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("the VMM was still running 30 s after SIGTERM")
	}
	// SIGTERM ends Firecracker with a signal status; that is the expected end.
	return nil
}

// waitBalloon polls the balloon statistics until actual_mib is want.
func waitBalloon(ctx context.Context, m *firecracker.Machine, want int64, within time.Duration) (models.BalloonStats, error) {
	deadline := time.Now().Add(within)
	var stats models.BalloonStats
	var err error
	for time.Now().Before(deadline) {
		stats, err = m.GetBalloonStats(ctx)
		if err == nil && stats.ActualMib != nil && *stats.ActualMib == want {
			return stats, nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		return stats, err
	}
	got := int64(-1)
	if stats.ActualMib != nil {
		got = *stats.ActualMib
	}
	return stats, fmt.Errorf("actual_mib %d, not %d, after %s", got, want, within)
}

func ms(since time.Time) string { return fmt.Sprintf("%d ms", time.Since(since).Milliseconds()) }

func main() {
	if len(os.Args) > 1 && os.Args[1] == "jailer" {
		jailerMain(os.Args[2:])
		return
	}
	kernel := flag.String("kernel", os.Getenv("GUEST_KERNEL"), "guest kernel (vmlinux)")
	initrd := flag.String("initrd", os.Getenv("GUEST_INITRD"), "guest initramfs")
	dir := flag.String("dir", os.TempDir(), "scratch directory (sockets, snapshot files)")
	flag.Parse()

	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	logger.SetOutput(os.Stderr)
	log := logrus.NewEntry(logger)

	bin, err := exec.LookPath("firecracker")
	must("firecracker-in-path", err, bin)

	vsockPath := filepath.Join(*dir, "v.sock")
	memPath := filepath.Join(*dir, "vm.mem")
	statePath := filepath.Join(*dir, "vm.state")
	ctx := context.Background() // the VMMs live until stop(); cancelling it would kill them

	// --- machine 1: the SDK's default handlers, plus a balloon (a pre-boot
	// device in Firecracker) with statistics every second.
	cfg := firecracker.Config{
		SocketPath:      filepath.Join(*dir, "fc1.sock"),
		LogPath:         filepath.Join(*dir, "fc1.log"),
		LogLevel:        "Info",
		KernelImagePath: *kernel,
		InitrdPath:      *initrd,
		KernelArgs:      cmdline,
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(memMiB),
		},
		VsockDevices: []firecracker.VsockDevice{{ID: "vsock0", Path: vsockPath, CID: guestCID}},
	}
	m1, err := firecracker.NewMachine(ctx, cfg, firecracker.WithLogger(log))
	must("sdk-new-machine", err, "")
	m1.Handlers.FcInit = m1.Handlers.FcInit.Append(firecracker.NewCreateBalloonHandler(0, false, 1))

	t0 := time.Now()
	err = m1.Start(ctx)
	must("sdk-start", err, ms(t0)+", "+state(ctx, m1))

	version, err := m1.GetFirecrackerVersion(ctx)
	result("sdk-version", err, version)

	t0 = time.Now()
	before, err := uptime(vsockPath, 150*time.Second)
	must("guest-up", err, fmt.Sprintf("first vsock answer %s after start, guest uptime %.2f s", ms(t0), before))

	err = m1.PauseVM(ctx)
	if err == nil && state(ctx, m1) != models.InstanceInfoStatePaused {
		err = fmt.Errorf("state %s after PauseVM", state(ctx, m1))
	}
	must("pause", err, "")

	t0 = time.Now()
	err = m1.CreateSnapshot(ctx, memPath, statePath)
	detail := ms(t0)
	if err == nil {
		// spore's memory file holds the guest's RAM plus its own layout
		// (a page more than Firecracker's); at least the RAM must be there.
		var st os.FileInfo
		if st, err = os.Stat(memPath); err == nil && st.Size() < memMiB<<20 {
			err = fmt.Errorf("memory file is %d bytes, less than the guest's %d", st.Size(), memMiB<<20)
		} else if err == nil {
			detail += fmt.Sprintf(", memory file %d bytes", st.Size())
		}
	}
	must("snapshot-create", err, detail)

	t0 = time.Now()
	must("stop", stop(m1), ms(t0))

	// --- machine 2: a new VMM process that loads the snapshot (WithSnapshot:
	// the SDK sends PUT /snapshot/load instead of the boot configuration).
	// The vsock socket of the stopped VMM is a stale file now; Firecracker
	// binds the restored device's socket anew and refuses an existing path,
	// so it is removed as with Firecracker.
	if err := os.Remove(vsockPath); err != nil && !os.IsNotExist(err) {
		must("snapshot-load", err, "removing the stale vsock socket")
	}
	cfg2 := firecracker.Config{
		SocketPath: filepath.Join(*dir, "fc2.sock"),
		LogPath:    filepath.Join(*dir, "fc2.log"),
		LogLevel:   "Debug",
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(1),
			MemSizeMib: firecracker.Int64(memMiB),
		},
	}
	m2, err := firecracker.NewMachine(ctx, cfg2, firecracker.WithLogger(log),
		firecracker.WithSnapshot(memPath, statePath))
	must("sdk-new-machine-from-snapshot", err, "")
	t0 = time.Now()
	err = m2.Start(ctx)
	st := state(ctx, m2)
	if err == nil && st != models.InstanceInfoStatePaused {
		err = fmt.Errorf("state %s after the load (resume_vm false)", st)
	}
	must("snapshot-load", err, ms(t0)+", "+st)

	t0 = time.Now()
	err = m2.ResumeVM(ctx)
	if err == nil && state(ctx, m2) != models.InstanceInfoStateRunning {
		err = fmt.Errorf("state %s after ResumeVM", state(ctx, m2))
	}
	must("resume", err, ms(t0))

	t0 = time.Now()
	after, err := uptime(vsockPath, 150*time.Second)
	if err == nil && after < before {
		err = fmt.Errorf("guest uptime went back from %.2f to %.2f s", before, after)
	}
	must("guest-answers-after-load", err, fmt.Sprintf("first answer %s after resume, uptime %.2f -> %.2f s", ms(t0), before, after))

	// --- balloon on the restored VM: its device came back from the snapshot.
	bc, err := m2.GetBalloonConfig(ctx)
	if err == nil && (bc.AmountMib == nil || *bc.AmountMib != 0 || bc.StatsPollingIntervals != 1) {
		err = fmt.Errorf("config after load: amount %v, stats every %d s", bc.AmountMib, bc.StatsPollingIntervals)
	}
	result("balloon-config-after-load", err, "")

	total0, err0 := memTotalKiB(vsockPath)
	t0 = time.Now()
	err = m2.UpdateBalloon(ctx, balloonMiB)
	var stats models.BalloonStats
	if err == nil {
		stats, err = waitBalloon(ctx, m2, balloonMiB, 60*time.Second)
	}
	result("balloon-inflate", err, fmt.Sprintf("%d MiB in %s", balloonMiB, ms(t0)))
	if err != nil {
		dumpVMM(m2)
	}

	total1, err1 := memTotalKiB(vsockPath)
	if err0 == nil && err1 == nil && total0-total1 != balloonMiB*1024 {
		err1 = fmt.Errorf("guest MemTotal %d -> %d KiB, not %d KiB less", total0, total1, balloonMiB*1024)
	}
	if err0 != nil {
		err1 = err0
	}
	result("balloon-guest-memtotal", err1, fmt.Sprintf("MemTotal %d -> %d KiB", total0, total1))

	// Statistics come from the guest's driver every second.
	err = nil
	if stats.TotalMemory <= 0 || stats.FreeMemory <= 0 || stats.FreeMemory > stats.TotalMemory ||
		stats.TargetMib == nil || *stats.TargetMib != balloonMiB {
		err = errors.New("implausible statistics")
	}
	result("balloon-stats", err, fmt.Sprintf("total %d B, free %d B, available %d B, target %v MiB",
		stats.TotalMemory, stats.FreeMemory, stats.AvailableMemory, ptr(stats.TargetMib)))

	err = m2.UpdateBalloonStats(ctx, 2)
	if err == nil {
		bc, err = m2.GetBalloonConfig(ctx)
		if err == nil && bc.StatsPollingIntervals != 2 {
			err = fmt.Errorf("stats interval %d after the update", bc.StatsPollingIntervals)
		}
	}
	result("balloon-stats-interval", err, "")

	t0 = time.Now()
	err = m2.UpdateBalloon(ctx, 0)
	if err == nil {
		_, err = waitBalloon(ctx, m2, 0, 60*time.Second)
	}
	result("balloon-deflate", err, ms(t0))

	_, err = guestRun(vsockPath, "echo alive", 30*time.Second)
	result("guest-answers-after-balloon", err, "")

	t0 = time.Now()
	result("stop-restored", stop(m2), ms(t0))
	if failed {
		os.Exit(1)
	}
}

// dumpVMM prints, after a failed step, what every thread of the VMM is doing
// (state, wait channel, kernel stack) and the end of L1's kernel log, so that
// a guest or VMM that stopped making progress can be told apart.
func dumpVMM(m *firecracker.Machine) {
	pid, err := m.PID()
	if err != nil {
		fmt.Printf("vmm-dump: no pid: %v\n", err)
		return
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, t := range tasks {
		read := func(f string) string {
			b, _ := os.ReadFile(filepath.Join(t, f))
			return strings.TrimSpace(string(b))
		}
		stat := read("stat")
		if i := strings.LastIndex(stat, ") "); i >= 0 && len(stat) > i+2 {
			stat = stat[i+2 : i+3]
		}
		fmt.Printf("vmm-dump: task %s comm=%s state=%s wchan=%s syscall=%s\n",
			filepath.Base(t), read("comm"), stat, read("wchan"), read("syscall"))
		for _, l := range strings.Split(read("stack"), "\n") {
			if l != "" {
				fmt.Printf("vmm-dump:   %s\n", l)
			}
		}
	}
	if out, err := exec.Command("dmesg").Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		for _, l := range lines {
			fmt.Printf("vmm-dump: dmesg %s\n", l)
		}
	}
}

func ptr(p *int64) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatInt(*p, 10)
}

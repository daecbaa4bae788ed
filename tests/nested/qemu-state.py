#!/usr/bin/env python3
"""Where L1's CPUs are: asks a running QEMU's monitor (a unix socket) for
every vCPU's state and registers.

    qemu-state.py MONITOR_SOCKET

run.sh calls it when a nested run stalls or L1 reports a soft lockup, before
it stops QEMU, and appends what it prints to the run's log: the data the open
stall bug (guest/README.md) needs: whether each CPU is halted (waiting for an
interrupt that does not come) or running, at which privilege level and RIP.
L1 boots with `nokaslr`, so a RIP is the same kernel address from run to run
(Debian's cloud kernel ships no System.map to name it here; its
linux-image-*-dbg package has one). Prints what it could get and exits 0; a
monitor that does not answer is said in one line.

An arm64 L1 (run.sh --arch arm64) has no RIP/CPL/HLT: each vCPU is shown
with its PC and exception level (EL2 with VHE is L1's kernel; EL1 or EL0
under it is an L2 guest), then the same full register dump.
"""
import re
import socket
import sys
import time


def ask(sock, command, quiet_s=1.0):
    sock.sendall(command.encode() + b"\n")
    out, last = b"", time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - last < quiet_s:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        out += chunk
        last = time.monotonic()
    # The monitor echoes with terminal escapes; keep plain text.
    return re.sub(rb"\x1b\[[0-9;]*[A-Za-z]", b"", out).decode(errors="replace")


def main():
    if len(sys.argv) < 2:
        print("usage: qemu-state.py MONITOR_SOCKET", file=sys.stderr)
        return 2
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(3)
        sock.connect(sys.argv[1])
    except OSError as e:
        print(f"QEMU-STATE: the monitor did not answer: {e}")
        return 0
    ask(sock, "", 0.5)  # the banner
    regs = ask(sock, "info registers -a", 2.0)
    regs = regs[regs.find("CPU#"):] if "CPU#" in regs else regs
    cpus = ask(sock, "info cpus", 1.0)
    cpus = "\n".join(l for l in cpus.splitlines() if "CPU #" in l)
    print("QEMU-STATE: info cpus")
    print(cpus.strip())
    # A CPU inside VMRUN shows the L2 guest's registers (its ring 0 is L2's
    # kernel then, not L1's).
    print("QEMU-STATE: each vCPU (a CPU running L2 shows L2's registers)")
    x86 = re.findall(r"RIP=([0-9a-f]+).*?CPL=(\d).*?HLT=(\d)", regs, re.S)
    for cpu, (rip, cpl, hlt) in enumerate(x86):
        state = "halted, waiting for an interrupt" if hlt == "1" else "running"
        print(f"QEMU-STATE: CPU {cpu}: {state}, RIP {int(rip, 16):#x} CPL {cpl}")
    if not x86:
        # aarch64: " PC=<hex> X00=..." and "PSTATE=<hex> <flags> EL<n><h|t>".
        arm = re.findall(r"\bPC=([0-9a-f]+).*?PSTATE=[0-9a-f]+ \S+ EL(\d)([ht])", regs, re.S)
        for cpu, (pc, el, sp) in enumerate(arm):
            print(f"QEMU-STATE: CPU {cpu}: PC {int(pc, 16):#x} EL{el}{sp}")
    print("QEMU-STATE: info registers -a")
    print(regs.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""envd's process service through the unmodified e2b SDK: commands and their
output, exit codes, working directory and environment, stdin, listing,
signals, reconnecting, large output, terminals, and the errors the SDK maps.
"""
import os
import time

from connectrpc.code import Code
from protobuf import Oneof

from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    SandboxException,
)
from e2b.envd.process import process_pb

from envd_common import check, envd_is_root, home, q, sandbox, sh


sbx = sandbox()


def running_pids():
    return {p.pid for p in sbx.commands.list()}


def wait_gone(pid, what, seconds=10):
    deadline = time.time() + seconds
    while pid in running_pids() and time.time() < deadline:
        time.sleep(0.1)
    check(pid not in running_pids(), what)


# -- run: output and exit codes ------------------------------------------------
r = sbx.commands.run("echo hi")
check(r.stdout == "hi\n" and r.stderr == "" and r.exit_code == 0 and r.error is None, "run echo hi")

try:
    sbx.commands.run("echo out; echo oops >&2; exit 3")
    check(False, "a failing command raises")
except CommandExitException as e:
    check(e.exit_code == 3, f"the exit code reaches CommandExitException ({e.exit_code})")
    check(e.stdout == "out\n" and e.stderr == "oops\n", f"with its output ({e.stdout!r}, {e.stderr!r})")
    # E2B's envd reports Go's wait error, which is the status for a non-zero exit.
    check(e.error == "exit status 3", f"and E2B's error text ({e.error!r})")

# -- working directory and environment ----------------------------------------
sub = os.path.join(home(), "sub dir")
sh(sbx, f"mkdir -p {q(sub)}")
r = sbx.commands.run('pwd; echo "$FOO $HOME"', cwd=sub, envs={"FOO": "bar"})
check(r.stdout == f"{sub}\nbar {home()}\n", f"cwd= and envs= ({r.stdout!r})")
r = sbx.commands.run("pwd", cwd="sub dir")
check(r.stdout == f"{sub}\n", "a relative cwd is from the home")
r = sbx.commands.run("pwd")
check(r.stdout == f"{home()}\n", "the default working directory")
try:
    sbx.commands.run("pwd", cwd=os.path.join(home(), "missing"))
    check(False, "a missing cwd is refused")
except InvalidArgumentException as e:
    check("does not exist" in str(e), f"a missing cwd is InvalidArgumentException ({e})")

# -- stdin ---------------------------------------------------------------------
h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "hello\n")
h.send_stdin(b"world\n")
sbx.commands.close_stdin(h.pid)
r = h.wait()
check(r.stdout == "hello\nworld\n", f"send_stdin + close_stdin to cat ({r.stdout!r})")

h = sbx.commands.run("head -n1", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "first\nsecond\n")
r = h.wait()
check(r.stdout == "first\n", f"head -n1 reads its line and exits ({r.stdout!r})")

h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.stream_input(h.pid, ["a", b"b", "c\n"])
h.close_stdin()
check(h.wait().stdout == "abc\n", "stream_input")

h = sbx.commands.run("sleep 600", background=True)
try:
    sbx.commands.send_stdin(h.pid, "x")
    check(False, "stdin of a process started without it is refused")
except SandboxException as e:
    check("stdin" in str(e), f"stdin not enabled: SandboxException ({e})")

# -- list and kill -------------------------------------------------------------
procs = {p.pid: p for p in sbx.commands.list()}
p = procs.get(h.pid)
check(p is not None, "list shows a background process")
check(p.cmd == "/bin/bash" and p.args == ["-l", "-c", "sleep 600"], f"with its cmd and args ({p})")
check(p.tag is None, "and no tag")

check(sbx.commands.kill(h.pid) is True, "kill finds the process")
try:
    h.wait()
    check(False, "a killed command's wait raises")
except CommandExitException as e:
    check(e.exit_code == -1 and e.error == "signal: killed", f"killed: exit -1, signal: killed ({e.exit_code}, {e.error!r})")
wait_gone(h.pid, "a killed process leaves the list")
check(sbx.commands.kill(h.pid) is False, "kill of an ended process returns False")

# A tag and SIGTERM, through the SDK's own RPC client (its commands API sets neither).
rpc = sbx.commands._rpc
events = rpc.start(
    process_pb.StartRequest(
        process=process_pb.ProcessConfig(cmd="sleep", args=["600"]),
        tag="sleeper",
    ),
)
pid = next(events).event.event.value.pid
tagged = [p for p in sbx.commands.list() if p.pid == pid]
check(tagged and tagged[0].tag == "sleeper" and tagged[0].cmd == "sleep", f"list shows the tag ({tagged})")
rpc.send_signal(
    process_pb.SendSignalRequest(
        process=process_pb.ProcessSelector(selector=Oneof("tag", "sleeper")),
        signal=process_pb.Signal.SIGTERM,
    )
)
end = None
for ev in events:
    if ev.event.event.field == "end":
        end = ev.event.event.value
check(end is not None and end.status == "signal: terminated" and not end.exited and end.exit_code == -1,
      f"SIGTERM by tag: signal: terminated ({end})")

# A command that cannot be started: E2B's envd answers invalid_argument.
try:
    next(rpc.start(process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="/nonexistent/cmd"))))
    check(False, "a missing command is refused")
except Exception as e:
    check(getattr(e, "code", None) == Code.INVALID_ARGUMENT and "/nonexistent/cmd" in str(e),
          f"a missing command: invalid_argument ({e})")

# KeepAlives on an idle stream, as often as the client asks.
events = rpc.start(
    process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="sleep", args=["2.5"])),
    headers={"Keepalive-Ping-Interval": "1"},
)
kinds = [ev.event.event.field for ev in events]
check(kinds[0] == "start" and kinds[-1] == "end" and kinds.count("keepalive") >= 2,
      f"keepalives on an idle stream ({kinds})")

# -- connect -------------------------------------------------------------------
h = sbx.commands.run("for i in $(seq 1 10); do echo line$i; sleep 0.3; done", background=True)
time.sleep(1.0)
c = sbx.commands.connect(h.pid)
check(c.pid == h.pid, "connect gets the pid")
r = c.wait()
lines = r.stdout.split()
check(r.exit_code == 0 and lines and lines[-1] == "line10" and "line1" not in lines,
      f"connect receives the later output ({lines})")
r = h.wait()
check(r.stdout.split() == [f"line{i}" for i in range(1, 11)], "the start stream got all of it")

try:
    sbx.commands.connect(999999)
    check(False, "connect to a missing pid raises")
except NotFoundException as e:
    check("999999" in str(e), f"connect to a missing pid: NotFoundException ({e})")

# -- large output --------------------------------------------------------------
chunks = []
r = sbx.commands.run("head -c 10000000 /dev/zero | tr '\\0' 'a'", on_stdout=chunks.append, timeout=120)
check(len(r.stdout) == 10_000_000 and r.stdout.count("a") == 10_000_000, f"10 MB arrives whole ({len(r.stdout)})")
check(sum(map(len, chunks)) == 10_000_000, "and on_stdout sees all of it")
n = 1_300_000
r = sbx.commands.run(f"seq 1 {n}", timeout=120)
check(r.stdout == "".join(f"{i}\n" for i in range(1, n + 1)), f"seq 1 {n} ({len(r.stdout)} bytes) arrives in order")

# Nobody listening: the output is drained and the process ends anyway.
h = sbx.commands.run("head -c 30000000 /dev/zero", background=True)
h.disconnect()
wait_gone(h.pid, "a process whose stream left still runs to its end", seconds=30)

# The call's timeout ends the process, as on E2B.
h = sbx.commands.run("sleep 30", background=True, timeout=1)
wait_gone(h.pid, "a process is killed when its timeout passes", seconds=5)

# -- PTY -----------------------------------------------------------------------
out = bytearray()
t = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.resize(t.pid, PtySize(rows=30, cols=100))
sbx.pty.send_stdin(t.pid, b"stty size; echo pty-ok-$((40+2))\nexit\n")
r = t.wait(on_pty=out.extend)
text = out.decode(errors="replace")
check("pty-ok-42" in text, f"a pty runs what is typed ({text[-200:]!r})")
check("30 100" in text, "resize reaches the terminal")
check(r.exit_code == 0, "the pty's shell exits 0")

# Two terminals at once: neither holds the other's open, so the first ends
# while the second still runs.
first = sbx.pty.create(PtySize(rows=24, cols=80))
second = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.send_stdin(first.pid, b"exit 5\n")
try:
    first.wait()
    check(False, "exit 5 in a pty raises")
except CommandExitException as e:
    check(e.exit_code == 5, "a pty ends while another one runs")
check(second.pid in running_pids(), "the other pty still runs")
try:
    sbx.commands.send_stdin(second.pid, "x")
    check(False, "stdin input to a pty is refused")
except SandboxException as e:
    check("pty" in str(e), f"stdin input to a pty: SandboxException ({e})")
check(sbx.pty.kill(second.pid), "pty.kill")
h = sbx.commands.run("sleep 600", background=True)
try:
    sbx.pty.resize(h.pid, PtySize(rows=1, cols=1))
    check(False, "resizing a process without a pty is refused")
except SandboxException as e:
    check("pty" in str(e), f"resize without a pty: SandboxException ({e})")
h.kill()

# -- other users ---------------------------------------------------------------
if envd_is_root(sbx):
    r = sbx.commands.run("id -un", user="nobody", cwd="/")
    check(r.stdout == "nobody\n", f"user= runs as that user ({r.stdout!r})")

# -- the access token ----------------------------------------------------------
try:
    sandbox(token="wrong").commands.run("echo x")
    check(False, "a wrong token is refused")
except AuthenticationException as e:
    check(True, f"a wrong token: AuthenticationException ({e})")

# envd reaps: none of its children is a zombie (this command's shell is its
# only child now).
r = sbx.commands.run(
    "for f in /proc/[0-9]*/status; do awk -v pp=$PPID '/^State/{s=$2} /^PPid/{if ($2 == pp) print s}' $f; done"
)
states = r.stdout.split()
check(len(states) == 1 and "Z" not in states, f"no zombies among envd's children ({states})")
check(running_pids() == set(), "nothing is left running")

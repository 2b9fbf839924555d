package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// watchdogScript waits for the process $1 (the test binary) to end, then
// ends every process whose command line names the API server's cert dir $2
// or etcd's data dir $3, and removes both directories. envtest starts the
// control plane in process groups of its own and offers no parent-death
// signal, so without the watchdog a test binary that is killed (SIGKILL, a
// killed process group) leaves etcd and kube-apiserver running for good.
const watchdogScript = `
parent=$1 certdir=$2 datadir=$3
while kill -0 "$parent" 2>/dev/null; do sleep 1; done
ours() {
	for d in /proc/[0-9]*; do
		c=$( (tr '\0' ' ' < "$d/cmdline") 2>/dev/null ) || continue
		case "$c" in
		*"--cert-dir=$certdir "*|*"--data-dir=$datadir "*) echo "${d#/proc/}" ;;
		esac
	done
}
for p in $(ours); do kill -TERM "$p" 2>/dev/null; done
sleep 10
for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
rm -rf "$certdir" "$datadir"
`

// startWatchdog starts the watchdog for e's control plane, if the system
// has /proc and /bin/sh; it returns nil otherwise.
func (e *Env) startWatchdog() *exec.Cmd {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		return nil
	}
	dataDir := e.env.ControlPlane.Etcd.DataDir
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "testenv-watchdog",
		strconv.Itoa(os.Getpid()), e.certDir, dataDir)
	// Its own process group, so that killing the test binary's group
	// leaves the watchdog to clean up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil
	}
	return cmd
}

// stopWatchdog ends the watchdog after a normal Stop.
func stopWatchdog(cmd *exec.Cmd) {
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

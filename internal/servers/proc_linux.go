package servers

import (
	"runtime"
	"sync"
	"syscall"
)

// sysProcAttr makes the kernel kill a child when its parent dies, so a test binary that crashes
// or is killed leaves no server behind, and puts the child in its own process group, so a Ctrl-C
// meant for `sigwatch demo` reaches the demo (which then stops its servers in order) and not the
// servers directly.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

var (
	spawnOnce sync.Once
	spawnReq  chan func()
)

// spawn runs start on one OS thread that never exits. Pdeathsig fires when the *thread* that
// forked the child exits, not the process (golang.org/issue/27505); Go may end a thread when a
// goroutine that locked it returns, which would kill a healthy server in the middle of a test.
// The goroutine started here is locked to its thread for the life of the process.
func spawn(start func() error) error {
	spawnOnce.Do(func() {
		spawnReq = make(chan func())
		go func() {
			runtime.LockOSThread()
			for f := range spawnReq {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnReq <- func() { errc <- start() }
	return <-errc
}

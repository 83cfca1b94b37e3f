//go:build !linux

package servers

import "syscall"

// sysProcAttr has no way outside Linux to tie a child's life to its parent's; Kill and Stop (and
// t.Cleanup in internal/testenv) are what stop the servers there.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func spawn(start func() error) error { return start() }

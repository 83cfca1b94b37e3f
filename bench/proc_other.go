//go:build !unix

package bench

import (
	"syscall"
	"time"
)

func childAttr() *syscall.SysProcAttr { return nil }

// processCPU is not measured on this platform.
func processCPU() time.Duration { return 0 }

// childCPU is not measured on this platform.
func childCPU(int) time.Duration { return 0 }

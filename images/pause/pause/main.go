// Command pause is the dev cluster's sandbox ("pause") process: it holds a pod's namespaces and does
// nothing else until SIGTERM or SIGINT. As PID 1 of a pod that shares its PID namespace it inherits the
// pod's orphans, so it reaps every child that exits.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking (one SIGCHLD may stand for several exits).
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

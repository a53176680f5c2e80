package imagetest

// Ops of the test program that try what a sandboxed pod must not do; each
// prints "allowed NAME" or "denied NAME: <error>" and goes on:
//
//	unix:PATH   connect to the unix socket PATH
//	bpf         load a trivial BPF socket filter program (bpf(2))
//	ptrace:PID  attach to process PID with ptrace(2)
//	read:PATH   read the file PATH
//	ids         print "ids uid=U gid=G groups=[...]" (the process's own)
//	ls:DIR      print "ls DIR: NAME NAME..." (sorted)
func init() { progFiles["attack.go"] = attackSource }

const attackSource = `package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"
)

// sysBPF is bpf(2)'s number (the syscall package has no constant).
var sysBPF = map[string]uintptr{"amd64": 321, "arm64": 280}

func verdict(name string, err error) {
	if err != nil {
		fmt.Printf("denied %s: %v\n", name, err)
		return
	}
	fmt.Printf("allowed %s\n", name)
}

func init() {
	extraOps["unix"] = func(arg string) {
		c, err := net.Dial("unix", arg)
		if err == nil {
			c.Close()
		}
		verdict("unix:"+arg, err)
	}
	extraOps["bpf"] = func(string) {
		// BPF_PROG_LOAD of "r0 = 0; exit" as a socket filter.
		insns := [2]uint64{0x00000000000000b7, 0x0000000000000095}
		license := []byte("GPL\x00")
		attr := struct {
			progType, insnCnt  uint32
			insns, license     uint64
			logLevel, logSize  uint32
			logBuf             uint64
		}{progType: 1, insnCnt: 2, insns: uint64(uintptr(unsafe.Pointer(&insns[0]))), license: uint64(uintptr(unsafe.Pointer(&license[0])))}
		fd, _, errno := syscall.Syscall(sysBPF[runtime.GOARCH], 5, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		var err error
		if errno != 0 {
			err = errno
		} else {
			syscall.Close(int(fd))
		}
		verdict("bpf", err)
	}
	extraOps["ptrace"] = func(arg string) {
		pid, _ := strconv.Atoi(arg)
		err := syscall.PtraceAttach(pid)
		if err == nil {
			syscall.PtraceDetach(pid)
		}
		verdict("ptrace:"+arg, err)
	}
	extraOps["read"] = func(arg string) {
		_, err := os.ReadFile(arg)
		verdict("read:"+arg, err)
	}
	extraOps["ids"] = func(string) {
		gs, _ := os.Getgroups()
		fmt.Printf("ids uid=%d gid=%d groups=%v\n", os.Getuid(), os.Getgid(), gs)
	}
	extraOps["ls"] = func(arg string) {
		es, err := os.ReadDir(arg)
		if err != nil {
			fmt.Printf("ls %s: %v\n", arg, err)
			return
		}
		fmt.Printf("ls %s:", arg)
		for _, e := range es {
			fmt.Printf(" %s", e.Name())
		}
		fmt.Println()
	}
}
`

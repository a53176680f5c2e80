package procgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// waitExited blocks until the child pid exited, leaving it a zombie.
func waitExited(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err
		}
	}
}

// stat holds the fields of /proc/<pid>/stat used here.
type stat struct {
	pgrp, session int
	startTicks    uint64
}

func readStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime priority nice threads
	// itrealvalue starttime ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return stat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	var st stat
	st.pgrp, _ = strconv.Atoi(string(f[2]))
	st.session, _ = strconv.Atoi(string(f[3]))
	st.startTicks, _ = strconv.ParseUint(string(f[19]), 10, 64)
	return st, nil
}

// StartTicks is pid's start time in clock ticks after boot
// (/proc/<pid>/stat), which with the pid identifies a process; 0 if
// unknown.
func StartTicks(pid int) uint64 {
	st, err := readStat(pid)
	if err != nil {
		return 0
	}
	return st.startTicks
}

// pidfd is a process descriptor (or, without pidfd support, the bare pid).
type pidfd struct {
	fd, pid int
}

func openPidfd(pid int) (pidfd, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) {
		return pidfd{fd: -1, pid: pid}, nil
	}
	if err != nil {
		return pidfd{}, err
	}
	return pidfd{fd: fd, pid: pid}, nil
}

func (p pidfd) signal(sig unix.Signal) error {
	if p.fd < 0 {
		return unix.Kill(p.pid, sig)
	}
	return unix.PidfdSendSignal(p.fd, sig, nil, 0)
}

func (p pidfd) close() {
	if p.fd >= 0 {
		unix.Close(p.fd)
	}
}

// members returns a descriptor of every process whose group (or session)
// is id, checked after the descriptor was opened: a process whose
// descriptor still signals afterwards is the one that was read.
func members(id int, session bool, skip map[int]bool) []pidfd {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []pidfd
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] {
			continue
		}
		st, err := readStat(pid)
		if err != nil || (!session && st.pgrp != id) || (session && st.session != id) {
			continue
		}
		fd, err := openPidfd(pid)
		if err != nil {
			continue
		}
		st, err = readStat(pid)
		if err != nil || (!session && st.pgrp != id) || (session && st.session != id) {
			fd.close()
			continue
		}
		out = append(out, fd)
	}
	return out
}

// killSession SIGKILLs every process of the session sid. The caller holds
// the unreaped session leader, so sid cannot name another session.
func killSession(sid int) {
	for round := 0; round < 10; round++ {
		ms := members(sid, true, map[int]bool{sid: true})
		if len(ms) == 0 {
			return
		}
		for _, m := range ms {
			m.signal(unix.SIGKILL)
			m.close()
		}
	}
}

// KillOrphanGroup SIGKILLs the process group led by pid, a process that is
// not this process's child (its parent, a shim, died), but only if pid is
// still the process that started at startTicks and leads its group: each
// member is checked while that leader is known to be alive, so no process
// that later got one of these numbers is signalled. It returns
// ErrFinished when the leader is gone (then nothing is signalled: the
// group's remaining processes, if any, cannot be told from a group that
// reused the number).
func KillOrphanGroup(pid int, startTicks uint64) error {
	if pid <= 0 || startTicks == 0 {
		return errors.New("procgroup: no process identity recorded")
	}
	leader, err := openPidfd(pid)
	if err != nil {
		return ErrFinished
	}
	defer leader.close()
	st, err := readStat(pid)
	if err != nil || st.startTicks != startTicks || leader.signal(0) != nil {
		return ErrFinished
	}
	if st.pgrp != pid {
		return fmt.Errorf("procgroup: process %d left its group (now %d)", pid, st.pgrp)
	}
	skip := map[int]bool{pid: true}
	for round := 0; round < 10; round++ {
		ms := members(pid, false, skip)
		// The leader still being alive means it held the group's number
		// the whole time: every member read above belongs to it.
		if leader.signal(0) != nil {
			for _, m := range ms {
				m.close()
			}
			break
		}
		for _, m := range ms {
			m.signal(unix.SIGKILL)
			m.close()
		}
		if len(ms) == 0 {
			break
		}
	}
	if err := leader.signal(unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

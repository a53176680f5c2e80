package seccomp

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// run interprets a filter for one seccomp_data the way the kernel does,
// for verdicts the test process cannot provoke (another audit arch) and
// for checking every comparison against plain Go. It first refuses what
// the kernel would refuse to load, so a filter that passes here but not
// there fails the test.
func run(t *testing.T, f []sandbox.SockFilter, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	checkLoadable(t, f)
	var data [64]byte
	put := func(off int, v uint32) {
		data[off], data[off+1], data[off+2], data[off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	put(offNr, nr)
	put(offArch, arch)
	for i, a := range args {
		put(offArgs+8*i, uint32(a))
		put(offArgs+8*i+4, uint32(a>>32))
	}
	var acc uint32
	for pc := 0; pc < len(f); pc++ {
		in := f[pc]
		switch in.Code {
		case bpfLdWAbs:
			o := int(in.K)
			acc = uint32(data[o]) | uint32(data[o+1])<<8 | uint32(data[o+2])<<16 | uint32(data[o+3])<<24
		case bpfAndK:
			acc &= in.K
		case bpfJa:
			pc += int(in.K)
		case bpfJeqK, bpfJgtK, bpfJgeK:
			ok := (in.Code == bpfJeqK && acc == in.K) || (in.Code == bpfJgtK && acc > in.K) || (in.Code == bpfJgeK && acc >= in.K)
			if ok {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case bpfRetK:
			return in.K
		}
	}
	t.Fatalf("filter ran off its end")
	return 0
}

// checkLoadable makes the kernel's checks of a seccomp program
// (bpf_check_classic, seccomp_check_filter): 1 to BPF_MAXINSNS
// instructions, only the opcodes a filter may use, aligned loads inside
// struct seccomp_data, every jump inside the program and a return last.
func checkLoadable(t *testing.T, f []sandbox.SockFilter) {
	t.Helper()
	if len(f) == 0 || len(f) > sandbox.MaxSeccompInsns {
		t.Fatalf("the kernel refuses a filter of %d instructions (1 to %d)", len(f), sandbox.MaxSeccompInsns)
	}
	for pc, in := range f {
		left := len(f) - pc - 1 // instructions after this one
		switch in.Code {
		case bpfLdWAbs:
			if in.K%4 != 0 || in.K > 60 {
				t.Fatalf("pc %d: load at %d, outside struct seccomp_data or unaligned", pc, in.K)
			}
		case bpfJa:
			if in.K >= uint32(left) {
				t.Fatalf("pc %d: ja %d jumps past the end (%d instructions)", pc, in.K, len(f))
			}
		case bpfJeqK, bpfJgtK, bpfJgeK:
			if int(in.Jt) >= left || int(in.Jf) >= left {
				t.Fatalf("pc %d: jt %d jf %d jump past the end (%d instructions)", pc, in.Jt, in.Jf, len(f))
			}
		case bpfAndK, bpfRetK:
		default:
			t.Fatalf("pc %d: opcode %#x is not allowed in a seccomp filter here", pc, in.Code)
		}
	}
	if f[len(f)-1].Code != bpfRetK {
		t.Fatalf("the last instruction is %#x, not a return: the kernel refuses the filter", f[len(f)-1].Code)
	}
}

func nr(t *testing.T, name string) uint32 {
	t.Helper()
	n, ok := sysnums[name]
	if !ok {
		t.Fatalf("no system call %s on this architecture", name)
	}
	return n
}

const (
	allow  = retAllow
	eperm  = retErrno | uint32(unix.EPERM)
	enosys = retErrno | uint32(unix.ENOSYS)
	kill   = retKillProcess
)

func TestRuntimeDefaultVerdicts(t *testing.T) {
	f, err := RuntimeDefault()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runtime default: %d instructions", len(f))
	const newns = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP
	threadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD)
	cases := []struct {
		name string
		args []uint64
		want uint32
	}{
		{"read", nil, allow}, {"write", nil, allow}, {"openat", nil, allow}, {"mmap", nil, allow},
		{"futex", nil, allow}, {"execve", nil, allow}, {"getpid", nil, allow}, {"clock_gettime", nil, allow},
		// What the shim's init does after loading, before it executes.
		{"setresuid", nil, allow}, {"setresgid", nil, allow}, {"setuid", nil, allow}, {"setgid", nil, allow},
		{"setgroups", nil, allow}, {"capget", nil, allow}, {"capset", nil, allow},
		{"prctl", nil, allow}, {"landlock_create_ruleset", nil, allow}, {"landlock_add_rule", nil, allow},
		{"landlock_restrict_self", nil, allow}, {"chdir", nil, allow},
		{"sethostname", nil, eperm}, // so the init sets the hostname before it loads the filter
		{"epoll_pwait", nil, allow}, {"rt_sigreturn", nil, allow}, {"exit_group", nil, allow}, {"chroot", nil, allow},
		{"clone", []uint64{threadFlags}, allow},
		{"clone", []uint64{uint64(unix.SIGCHLD | unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD)}, allow},
		{"clone", []uint64{uint64(unix.CLONE_NEWUSER)}, eperm},
		{"clone", []uint64{threadFlags | unix.CLONE_NEWNET}, eperm},
		{"clone", []uint64{newns}, eperm},
		{"clone3", nil, enosys},
		{"unshare", []uint64{unix.CLONE_NEWUSER}, eperm},
		{"unshare", []uint64{0}, eperm},
		{"setns", nil, eperm}, {"mount", nil, eperm}, {"umount2", nil, eperm}, {"pivot_root", nil, eperm},
		{"bpf", nil, eperm}, {"keyctl", nil, eperm}, {"add_key", nil, eperm}, {"request_key", nil, eperm},
		{"kexec_load", nil, eperm}, {"kexec_file_load", nil, eperm},
		{"init_module", nil, eperm}, {"finit_module", nil, eperm}, {"delete_module", nil, eperm},
		{"reboot", nil, eperm}, {"swapon", nil, eperm}, {"swapoff", nil, eperm},
		{"open_by_handle_at", nil, eperm}, {"perf_event_open", nil, eperm}, {"userfaultfd", nil, eperm},
		{"ptrace", nil, eperm}, {"process_vm_readv", nil, eperm}, {"process_vm_writev", nil, eperm},
		{"fsopen", nil, eperm}, {"fsmount", nil, eperm}, {"move_mount", nil, eperm}, {"open_tree", nil, eperm},
		{"settimeofday", nil, eperm}, {"clock_settime", nil, eperm}, {"acct", nil, eperm},
		{"personality", []uint64{0}, allow}, {"personality", []uint64{8}, allow},
		{"personality", []uint64{0x20000}, allow}, {"personality", []uint64{0xffffffff}, allow},
		{"personality", []uint64{0x0400000}, eperm}, // READ_IMPLIES_EXEC
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, allow},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_DGRAM, 0}, allow},
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, allow},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 0}, allow},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, ipprotoMPTCP}, eperm},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_STREAM, ipprotoMPTCP}, eperm},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM, 1<<32 | ipprotoMPTCP}, eperm},
		{"socket", []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eperm},
		{"socket", []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET, 0}, eperm},
	}
	for _, c := range cases {
		if got := run(t, f, auditArch, nr(t, c.name), c.args...); got != c.want {
			t.Errorf("%s(%#x) = %#x, want %#x", c.name, c.args, got, c.want)
		}
	}
	if got := run(t, f, auditArch, 3000); got != eperm {
		t.Errorf("unknown call 3000 = %#x, want EPERM", got)
	}
	if got := run(t, f, 0x40000003 /* AUDIT_ARCH_I386 */, nr(t, "getpid")); got != kill {
		t.Errorf("foreign audit arch = %#x, want KILL_PROCESS", got)
	}
	if x32Bit != 0 {
		if got := run(t, f, auditArch, x32Bit|nr(t, "getpid")); got != kill {
			t.Errorf("x32 getpid = %#x, want KILL_PROCESS", got)
		}
	}
}

func TestRuntimeDefaultForCapabilities(t *testing.T) {
	f, err := RuntimeDefaultFor(append([]string{"SYS_PTRACE", "sys_admin"}, DefaultCapabilities...))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ptrace", "mount", "unshare", "setns", "process_vm_readv"} {
		if got := run(t, f, auditArch, nr(t, name)); got != allow {
			t.Errorf("with CAP_SYS_ADMIN and CAP_SYS_PTRACE %s = %#x, want ALLOW", name, got)
		}
	}
	if got := run(t, f, auditArch, nr(t, "socket"), unix.AF_INET, unix.SOCK_STREAM, ipprotoMPTCP); got != eperm {
		t.Errorf("MPTCP with more capabilities = %#x, want EPERM", got)
	}
	d, _ := RuntimeDefault()
	if got := run(t, d, auditArch, nr(t, "mount")); got != eperm {
		t.Errorf("the cache mixed capability sets: default mount = %#x", got)
	}
}

// TestCompileMatchesReference checks each comparison, with 64-bit values
// that differ only in one half, against Go's own arithmetic.
func TestCompileMatchesReference(t *testing.T) {
	ops := []specs.LinuxSeccompOperator{specs.OpEqualTo, specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual,
		specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpMaskedEqual}
	holds := func(op specs.LinuxSeccompOperator, a, v, v2 uint64) bool {
		switch op {
		case specs.OpEqualTo:
			return a == v
		case specs.OpNotEqual:
			return a != v
		case specs.OpLessThan:
			return a < v
		case specs.OpLessEqual:
			return a <= v
		case specs.OpGreaterThan:
			return a > v
		case specs.OpGreaterEqual:
			return a >= v
		}
		return a&v == v2
	}
	rng := rand.New(rand.NewSource(1))
	pick := func() uint64 {
		base := []uint64{0, 1, 2, 0xffffffff, 1 << 32, 1<<32 | 1, 0xffffffff00000000, ^uint64(0), 262, 1<<32 | 262}
		if rng.Intn(2) == 0 {
			return base[rng.Intn(len(base))]
		}
		return rng.Uint64() >> uint(rng.Intn(64))
	}
	getpid := nr(t, "getpid")
	for i := 0; i < 2000; i++ {
		op := ops[rng.Intn(len(ops))]
		v, v2 := pick(), pick()
		idx := uint(rng.Intn(6))
		second := specs.LinuxSeccompArg{Index: (idx + 1) % 6, Value: pick(), Op: ops[rng.Intn(len(ops)-1)]}
		p := &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Syscalls: []specs.LinuxSyscall{{
				Names: []string{"getpid"}, Action: specs.ActErrno,
				Args: []specs.LinuxSeccompArg{{Index: idx, Value: v, ValueTwo: v2, Op: op}, second},
			}},
		}
		f, err := compile(p)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 20; j++ {
			args := make([]uint64, 6)
			for k := range args {
				args[k] = pick()
			}
			if j%2 == 0 {
				args[idx] = v
			}
			want := uint32(allow)
			if holds(op, args[idx], v, v2) && holds(second.Op, args[second.Index], second.Value, 0) {
				want = eperm
			}
			if got := run(t, f, auditArch, getpid, args...); got != want {
				t.Fatalf("arg%d %s %#x (two %#x) and arg%d %s %#x on %#x: got %#x want %#x",
					idx, op, v, v2, second.Index, second.Op, second.Value, args, got, want)
			}
		}
	}
}

// TestCompileLongJumps makes a profile whose conditional blocks push
// targets past the 255-instruction reach of a conditional jump.
func TestCompileLongJumps(t *testing.T) {
	p := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno}
	names := []string{}
	for name := range sysnums {
		names = append(names, name)
	}
	for i, name := range names {
		if i%2 == 0 {
			p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 1, Value: uint64(i), Op: specs.OpEqualTo}}})
		} else {
			p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActAllow})
		}
	}
	f, err := compile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) < 600 {
		t.Fatalf("only %d instructions: the test does not reach long jumps", len(f))
	}
	for i, name := range names {
		n := sysnums[name]
		if i%2 == 0 {
			if got := run(t, f, auditArch, n, 0, uint64(i)); got != allow {
				t.Fatalf("%s with arg1=%d = %#x, want ALLOW", name, i, got)
			}
			if got := run(t, f, auditArch, n, 0, uint64(i)+1); got != eperm {
				t.Fatalf("%s with arg1=%d = %#x, want EPERM", name, i+1, got)
			}
		} else if got := run(t, f, auditArch, n); got != allow {
			t.Fatalf("%s = %#x, want ALLOW", name, got)
		}
	}
}

func TestCompilePrecedenceAndErrno(t *testing.T) {
	e := uint(unix.EOPNOTSUPP)
	p := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"getppid"}, Action: specs.ActAllow},
			{Names: []string{"getppid"}, Action: specs.ActErrno, ErrnoRet: &e},
			{Names: []string{"uname"}, Action: specs.ActKillProcess, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0, Op: specs.OpEqualTo}}},
			{Names: []string{"uname"}, Action: specs.ActErrno},
			// Two comparisons of one argument are alternatives (runc).
			{Names: []string{"dup"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 3, Op: specs.OpEqualTo}, {Index: 0, Value: 5, Op: specs.OpEqualTo}}},
		},
	}
	f, err := compile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		arg  uint64
		want uint32
	}{
		{"getppid", 0, retErrno | uint32(unix.EOPNOTSUPP)},
		{"uname", 0, kill}, {"uname", 1, eperm},
		{"dup", 3, eperm}, {"dup", 5, eperm}, {"dup", 4, allow},
		{"getpid", 0, allow},
	} {
		if got := run(t, f, auditArch, nr(t, c.name), c.arg); got != c.want {
			t.Errorf("%s(%d) = %#x, want %#x", c.name, c.arg, got, c.want)
		}
	}
}

func TestCompileRefuses(t *testing.T) {
	bad := func(s specs.LinuxSyscall) *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{s}}
	}
	for _, c := range []struct {
		p    *specs.LinuxSeccomp
		want string
	}{
		{&specs.LinuxSeccomp{DefaultAction: "SCMP_ACT_NOPE"}, "defaultAction: unknown action"},
		{&specs.LinuxSeccomp{DefaultAction: specs.ActNotify}, "seccomp agent"},
		{&specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_LOG"}}, "flags"},
		{&specs.LinuxSeccomp{DefaultAction: specs.ActErrno, ListenerPath: "/run/agent.sock"}, "listenerPath"},
		{&specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Architectures: []specs.Arch{"SCMP_ARCH_S390X"}}, "do not include"},
		{bad(specs.LinuxSyscall{Action: specs.ActAllow}), "syscalls[0]: no names"},
		{bad(specs.LinuxSyscall{Names: []string{"read"}}), "syscalls[0] (read): no action"},
		{bad(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 6, Op: specs.OpEqualTo}}}), "(read).args[0]: index 6"},
		{bad(specs.LinuxSyscall{Names: []string{"read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Op: "SCMP_CMP_LIKE"}}}), "unknown op"},
	} {
		_, err := compile(c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("compile(%+v) = %v, want an error with %q", c.p, err, c.want)
		}
	}
}

// TestMobyNamesResolve keeps the generated table in step with moby's
// list: a name of the default profile that is unknown here would be
// silently denied.
func TestMobyNamesResolve(t *testing.T) {
	prof, err := runtimeDefaultProfile(DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, s := range prof.Syscalls {
		for _, n := range s.Names {
			if _, ok := sysnums[n]; !ok {
				missing = append(missing, n)
			}
		}
	}
	t.Logf("names of the default profile without a number on this architecture: %v", missing)
	for _, n := range missing {
		if n == "read" || n == "openat" || strings.HasPrefix(n, "clone") || n == "socket" {
			t.Errorf("%s has no number here: regenerate zsysnum (go run gen_sysnum.go)", n)
		}
	}
}

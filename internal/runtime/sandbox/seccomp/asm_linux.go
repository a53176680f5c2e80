package seccomp

import (
	"fmt"

	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// Classic BPF opcodes a seccomp filter uses (linux/filter.h).
const (
	bpfLdWAbs = 0x20 // BPF_LD|BPF_W|BPF_ABS
	bpfAndK   = 0x54 // BPF_ALU|BPF_AND|BPF_K
	bpfJa     = 0x05 // BPF_JMP|BPF_JA
	bpfJeqK   = 0x15 // BPF_JMP|BPF_JEQ|BPF_K
	bpfJgtK   = 0x25 // BPF_JMP|BPF_JGT|BPF_K
	bpfJgeK   = 0x35 // BPF_JMP|BPF_JGE|BPF_K
	bpfRetK   = 0x06 // BPF_RET|BPF_K
)

// label names an instruction position; resolved at layout.
type label int

// insn is one instruction before layout: jumps name labels, because
// classic BPF's conditional jumps reach only 255 instructions forward and
// the assembler widens the ones that must go further.
type insn struct {
	code   uint16
	k      uint32
	jt, jf label // conditional jumps
	to     label // BPF_JA
	wide   bool  // conditional jump laid out as Jcond 0,1; JA jt; JA jf
	isMark bool  // a label's position, not an instruction
	mark   label
}

type asm struct {
	insns  []insn
	labels int
}

func (a *asm) newLabel() label { a.labels++; return label(a.labels) }

func (a *asm) mark(l label) { a.insns = append(a.insns, insn{isMark: true, mark: l}) }

func (a *asm) ld(off uint32) { a.insns = append(a.insns, insn{code: bpfLdWAbs, k: off}) }

func (a *asm) and(k uint32) { a.insns = append(a.insns, insn{code: bpfAndK, k: k}) }

func (a *asm) ret(k uint32) { a.insns = append(a.insns, insn{code: bpfRetK, k: k}) }

func (a *asm) jmp(to label) { a.insns = append(a.insns, insn{code: bpfJa, to: to}) }

// jump goes to t when A <op> k holds, else to f.
func (a *asm) jump(code uint16, k uint32, t, f label) {
	a.insns = append(a.insns, insn{code: code, k: k, jt: t, jf: f})
}

func (in *insn) size() int {
	switch {
	case in.isMark:
		return 0
	case in.wide:
		return 3
	}
	return 1
}

// assemble lays the program out, widening conditional jumps that do not
// fit in 8 bits until none is left, and checks that every jump goes
// forward (classic BPF has no backward jumps).
func (a *asm) assemble() ([]sandbox.SockFilter, error) {
	for {
		pos := make(map[label]int, a.labels)
		n := 0
		for i := range a.insns {
			if a.insns[i].isMark {
				pos[a.insns[i].mark] = n
			}
			n += a.insns[i].size()
		}
		if n > sandbox.MaxSeccompInsns {
			return nil, fmt.Errorf("the filter has %d instructions, more than the kernel's limit of %d: the profile has too many rules", n, sandbox.MaxSeccompInsns)
		}
		widened := false
		out := make([]sandbox.SockFilter, 0, n)
		at := 0
		for i := range a.insns {
			in := &a.insns[i]
			if in.isMark {
				continue
			}
			size := in.size() // before this pass may widen it
			next := at + 1
			switch in.code {
			case bpfJa:
				d, err := dist(pos, in.to, next)
				if err != nil {
					return nil, err
				}
				out = append(out, sandbox.SockFilter{Code: bpfJa, K: uint32(d)})
			case bpfJeqK, bpfJgtK, bpfJgeK:
				if in.wide {
					dt, err := dist(pos, in.jt, at+2)
					if err != nil {
						return nil, err
					}
					df, err := dist(pos, in.jf, at+3)
					if err != nil {
						return nil, err
					}
					out = append(out,
						sandbox.SockFilter{Code: in.code, Jt: 0, Jf: 1, K: in.k},
						sandbox.SockFilter{Code: bpfJa, K: uint32(dt)},
						sandbox.SockFilter{Code: bpfJa, K: uint32(df)})
					break
				}
				dt, err := dist(pos, in.jt, next)
				if err != nil {
					return nil, err
				}
				df, err := dist(pos, in.jf, next)
				if err != nil {
					return nil, err
				}
				if dt > 255 || df > 255 {
					in.wide = true
					widened = true
				}
				out = append(out, sandbox.SockFilter{Code: in.code, Jt: uint8(dt), Jf: uint8(df), K: in.k})
			default:
				out = append(out, sandbox.SockFilter{Code: in.code, K: in.k})
			}
			at += size
		}
		if !widened {
			return out, nil
		}
	}
}

func dist(pos map[label]int, l label, from int) (int, error) {
	p, ok := pos[l]
	if !ok {
		return 0, fmt.Errorf("seccomp assembler: label %d never placed", l)
	}
	if p < from {
		return 0, fmt.Errorf("seccomp assembler: backward jump to label %d", l)
	}
	return p - from, nil
}

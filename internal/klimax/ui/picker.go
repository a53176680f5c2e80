package ui

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"
)

// ErrCancelled is returned when the user leaves the picker without choosing.
var ErrCancelled = errors.New("cancelled")

// Key is one decoded key press.
type Key int

const (
	KeyNone Key = iota
	KeyUp
	KeyDown
	KeyToggle
	KeyAll
	KeyEnter
	KeyCancel
)

// Picker is the multi-select model: pure state, driven by keys, rendered to
// text. The terminal loop in Run is a thin layer over it.
type Picker struct {
	Title    string
	Items    []string
	Cursor   int
	Selected map[int]bool
	Done     bool
	Canceled bool
}

// NewPicker starts with nothing selected.
func NewPicker(title string, items []string) *Picker {
	return &Picker{Title: title, Items: items, Selected: map[int]bool{}}
}

// Handle applies one key.
func (p *Picker) Handle(k Key) {
	n := len(p.Items)
	switch k {
	case KeyUp:
		if n > 0 {
			p.Cursor = (p.Cursor - 1 + n) % n
		}
	case KeyDown:
		if n > 0 {
			p.Cursor = (p.Cursor + 1) % n
		}
	case KeyToggle:
		if n > 0 {
			p.Selected[p.Cursor] = !p.Selected[p.Cursor]
		}
	case KeyAll:
		all := len(p.Chosen()) == n
		for i := range p.Items {
			p.Selected[i] = !all
		}
	case KeyEnter:
		p.Done = true
	case KeyCancel:
		p.Done, p.Canceled = true, true
	}
}

// Chosen returns the selected items in list order.
func (p *Picker) Chosen() []string {
	var out []string
	for i, it := range p.Items {
		if p.Selected[i] {
			out = append(out, it)
		}
	}
	return out
}

// View renders the picker (lines end with \r\n for raw terminals).
func (p *Picker) View() string {
	var b strings.Builder
	b.WriteString(p.Title + "\r\n")
	b.WriteString("  (↑/↓ or j/k move, space select, a all, enter confirm, q cancel)\r\n")
	for i, it := range p.Items {
		cur, box := "  ", "[ ]"
		if i == p.Cursor {
			cur = "> "
		}
		if p.Selected[i] {
			box = "[x]"
		}
		fmt.Fprintf(&b, "%s%s %s\r\n", cur, box, it)
	}
	return b.String()
}

// decodeKeys turns raw terminal input into keys; escape sequences for the
// arrow keys are recognised.
func decodeKeys(r *bufio.Reader) (Key, error) {
	c, err := r.ReadByte()
	if err != nil {
		return KeyNone, err
	}
	switch c {
	case 'k':
		return KeyUp, nil
	case 'j':
		return KeyDown, nil
	case ' ', 'x':
		return KeyToggle, nil
	case 'a':
		return KeyAll, nil
	case '\r', '\n':
		return KeyEnter, nil
	case 'q', 3 /* ctrl-c */, 4 /* ctrl-d */ :
		return KeyCancel, nil
	case 27: // ESC, maybe an arrow sequence
		if r.Buffered() == 0 {
			return KeyCancel, nil
		}
		b1, _ := r.ReadByte()
		if b1 != '[' && b1 != 'O' {
			return KeyCancel, nil
		}
		b2, _ := r.ReadByte()
		switch b2 {
		case 'A':
			return KeyUp, nil
		case 'B':
			return KeyDown, nil
		}
	}
	return KeyNone, nil
}

// RunPicker drives p from in, drawing to out, until confirm or cancel. When
// in is a terminal it is switched to raw mode for the duration.
func RunPicker(p *Picker, in io.Reader, out io.Writer) ([]string, error) {
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		old, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return nil, err
		}
		defer term.Restore(int(f.Fd()), old)
	}
	r := bufio.NewReader(in)
	lines := 0
	draw := func() {
		if lines > 0 {
			fmt.Fprintf(out, "\033[%dA\033[J", lines) // move up and clear the previous frame
		}
		v := p.View()
		lines = strings.Count(v, "\n")
		io.WriteString(out, v)
	}
	draw()
	for !p.Done {
		k, err := decodeKeys(r)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, ErrCancelled
			}
			return nil, err
		}
		if k == KeyNone {
			continue
		}
		p.Handle(k)
		draw()
	}
	if p.Canceled {
		return nil, ErrCancelled
	}
	return p.Chosen(), nil
}

// Confirm asks a yes/no question on a terminal; the default is no.
func Confirm(in io.Reader, out io.Writer, question string) (bool, error) {
	fmt.Fprintf(out, "%s [y/N] ", question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes", nil
}

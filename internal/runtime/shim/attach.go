package shim

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/creack/pty"
)

// The attach stream. A client sends {"op":"attach","stdin":bool} and reads
// one Response line; if the container still runs, the connection then
// carries frames both ways until the container exits (the shim sends
// FrameExit and closes) or the client leaves. A frame is one kind byte, a
// big-endian uint32 length and the payload.
const (
	FrameStdin      byte = 0 // client → shim: bytes for the container's stdin
	FrameStdout     byte = 1 // shim → client
	FrameStderr     byte = 2 // shim → client
	FrameExit       byte = 3 // shim → client: JSON ExitStatus, the last frame
	FrameCloseStdin byte = 4 // client → shim: this client is done with stdin
	FrameResize     byte = 5 // client → shim: width, height (uint16 each); ignored without a TTY
)

// MaxFrame bounds a frame's payload.
const MaxFrame = 1 << 20

// clientQueue is how many output frames may wait for one attached client; a
// client further behind is disconnected so it never slows the container or
// its log.
const clientQueue = 256

// WriteFrame writes one frame. Callers serialize writes on a connection.
func WriteFrame(w io.Writer, kind byte, p []byte) error {
	if len(p) > MaxFrame {
		return fmt.Errorf("attach frame of %d bytes exceeds %d", len(p), MaxFrame)
	}
	b := make([]byte, 5+len(p))
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:5], uint32(len(p)))
	copy(b[5:], p)
	_, err := w.Write(b)
	return err
}

// ReadFrame reads one frame.
func ReadFrame(r io.Reader) (kind byte, p []byte, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:5])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("attach frame of %d bytes exceeds %d", n, MaxFrame)
	}
	p = make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

type frame struct {
	kind byte
	data []byte
}

type attachClient struct {
	ch chan frame
}

// fanout is the output side of a stream as the copier reads it: every
// chunk goes to each attached client. It never fails and never blocks, so
// the CRI log is written whatever the clients do.
type fanout struct {
	s    *server
	kind byte
}

func (f fanout) Write(p []byte) (int, error) {
	s := f.s
	s.amu.Lock()
	defer s.amu.Unlock()
	if len(s.clients) == 0 {
		return len(p), nil
	}
	data := append([]byte(nil), p...)
	for c := range s.clients {
		select {
		case c.ch <- frame{f.kind, data}:
		default:
			delete(s.clients, c)
			close(c.ch)
		}
	}
	return len(p), nil
}

// finishClients gives every attached client the exit status and ends its
// stream. Called once all output has been copied.
func (s *server) finishClients(es *ExitStatus) {
	b, _ := json.Marshal(es)
	s.amu.Lock()
	defer s.amu.Unlock()
	s.attachDone = true
	for c := range s.clients {
		select {
		case c.ch <- frame{FrameExit, b}:
		case <-time.After(time.Second):
		}
		delete(s.clients, c)
		close(c.ch)
	}
}

func (s *server) writeStdin(p []byte) {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	switch {
	case s.pty != nil:
		if s.cfg.Stdin && !s.ptyEOF {
			s.pty.Write(p)
		}
	case s.stdin != nil:
		s.stdin.Write(p)
	}
}

// closeStdin closes the container's stdin pipe; on a terminal, which has
// no half close, it types end-of-input (^D) once and takes no more input.
func (s *server) closeStdin() {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if s.pty != nil {
		if s.cfg.Stdin && !s.ptyEOF {
			s.ptyEOF = true
			s.pty.Write([]byte{4})
		}
		return
	}
	if s.stdin != nil {
		s.stdin.Close()
		s.stdin = nil
	}
}

// resize sets the terminal's size (no terminal: nothing to do).
func (s *server) resize(p []byte) {
	if s.pty == nil || len(p) != 4 {
		return
	}
	w, h := binary.BigEndian.Uint16(p[0:2]), binary.BigEndian.Uint16(p[2:4])
	if w > 0 && h > 0 {
		pty.Setsize(s.pty, &pty.Winsize{Cols: w, Rows: h})
	}
}

// attach serves one attach connection (after its request line).
func (s *server) attach(c *net.UnixConn, br *bufio.Reader, req Request) {
	cl := &attachClient{ch: make(chan frame, clientQueue)}
	s.amu.Lock()
	done := s.attachDone
	if !done {
		s.clients[cl] = struct{}{}
	}
	s.amu.Unlock()
	resp := s.state()
	if done {
		resp.Running = false
	}
	if err := writeLine(c, resp); err != nil || done {
		s.drop(cl)
		return
	}
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		defer c.Close()
		for fr := range cl.ch {
			if WriteFrame(c, fr.kind, fr.data) != nil {
				s.drop(cl)
				for range cl.ch {
				}
				return
			}
		}
	}()
	usedStdin := false
	for {
		kind, p, err := ReadFrame(br)
		if err != nil {
			break
		}
		switch kind {
		case FrameStdin:
			if req.Stdin {
				usedStdin = true
				s.writeStdin(p)
			}
		case FrameCloseStdin:
			if req.Stdin && s.cfg.StdinOnce {
				s.closeStdin()
			}
		case FrameResize:
			s.resize(p)
		}
	}
	// stdinOnce: the container's stdin closes when the first client that
	// attached to it leaves, as the kubelet does.
	if req.Stdin && usedStdin && s.cfg.StdinOnce {
		s.closeStdin()
	}
	s.drop(cl)
	<-writerDone
}

// drop unregisters a client (its writer then ends).
func (s *server) drop(cl *attachClient) {
	s.amu.Lock()
	defer s.amu.Unlock()
	if _, ok := s.clients[cl]; ok {
		delete(s.clients, cl)
		close(cl.ch)
	}
}

func writeLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Package criolog owns the CRI container log format the shim writes and the
// daemon reads back for `kubectl logs`:
//
//	<RFC3339Nano timestamp> <stdout|stderr> <F|P> <content>\n
//
// F marks the end of a line, P a partial line that continues in the next
// record (a line longer than the writer's buffer). The package uses only the
// standard library: the shim links it, and the shim must stay small.
package criolog

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// MaxLine is the longest content the writer puts in one record; longer lines
// are split into P records, as containerd does.
const MaxLine = 16 * 1024

// Stream names as they appear in a record.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Writer appends records to a log file. It is safe for concurrent use by the
// stdout and stderr copiers.
type Writer struct {
	mu   sync.Mutex
	path string
	f    *os.File
	now  func() time.Time
	buf  []byte
	size int64 // of the live file

	// Rotation (SetRotation); zero maxSize: never rotate.
	maxSize  int64
	maxFiles int
}

// Create opens (appending) the log file at path.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	w := &Writer{path: path, f: f, now: time.Now}
	if fi, err := f.Stat(); err == nil {
		w.size = fi.Size()
	}
	return w, nil
}

// SetRotation makes the writer rotate its file as the kubelet's container
// log manager does (containerLogMaxSize, containerLogMaxFiles): once the
// live file reaches maxSize bytes it is renamed to <path>.<timestamp>
// (RotatedSuffix), a new file is opened at path, and the oldest rotated
// files are removed so that at most maxFiles files (the live one included)
// remain. maxSize 0 turns rotation off; maxFiles below 2 counts as 2.
func (w *Writer) SetRotation(maxSize int64, maxFiles int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.maxSize, w.maxFiles = maxSize, max(maxFiles, 2)
}

// RotatedSuffix is the time layout appended to a rotated file's name (the
// kubelet's "20060102-150405" with microseconds, so that two rotations in
// one second sort and do not collide).
const RotatedSuffix = "20060102-150405.000000"

// Reopen closes and reopens the file at the same path (after a rotation).
func (w *Writer) Reopen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reopenLocked()
}

func (w *Writer) reopenLocked() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	old := w.f
	w.f = f
	w.size = 0
	if fi, err := f.Stat(); err == nil {
		w.size = fi.Size()
	}
	return old.Close()
}

// rotateLocked renames the live file aside, opens a new one and prunes.
func (w *Writer) rotateLocked() error {
	rotated := w.path + "." + w.now().UTC().Format(RotatedSuffix)
	if _, err := os.Lstat(rotated); err == nil {
		return nil // same microsecond: rotate on the next write
	}
	if err := os.Rename(w.path, rotated); err != nil {
		return err
	}
	if err := w.reopenLocked(); err != nil {
		return err
	}
	old := Rotated(w.path)
	for len(old) > w.maxFiles-1 {
		os.Remove(old[0])
		old = old[1:]
	}
	return nil
}

// Rotated lists the rotated files of the log at path, oldest first.
func Rotated(path string) []string {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		suffix, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok || len(suffix) != len(RotatedSuffix) {
			continue
		}
		if _, err := time.Parse(RotatedSuffix, suffix); err != nil {
			continue
		}
		out = append(out, filepath.Join(dir, e.Name()))
	}
	sort.Strings(out)
	return out
}

// RemoveAll removes the log at path and its rotated files.
func RemoveAll(path string) {
	for _, p := range Rotated(path) {
		os.Remove(p)
	}
	os.Remove(path)
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}

// WriteRecord appends one record. content must not contain a newline.
func (w *Writer) WriteRecord(stream string, partial bool, content []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	tag := byte('F')
	if partial {
		tag = 'P'
	}
	b := w.buf[:0]
	b = w.now().UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, ' ')
	b = append(b, stream...)
	b = append(b, ' ', tag, ' ')
	b = append(b, content...)
	b = append(b, '\n')
	w.buf = b
	n, err := w.f.Write(b)
	w.size += int64(n)
	if err == nil && w.maxSize > 0 && w.size >= w.maxSize {
		// A rotation that fails (disk full, ...) must not stop the
		// container's output: keep appending and try again next record.
		w.rotateLocked()
	}
	return err
}

// Copy reads r until EOF and writes its lines as records of stream. A last
// line without a newline is written as a full record at EOF.
func (w *Writer) Copy(stream string, r io.Reader) error {
	br := bufio.NewReaderSize(r, MaxLine)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			if werr := w.WriteRecord(stream, false, line[:len(line)-1]); werr != nil {
				return werr
			}
		case errors.Is(err, bufio.ErrBufferFull):
			if werr := w.WriteRecord(stream, true, line); werr != nil {
				return werr
			}
		default:
			if len(line) > 0 {
				if werr := w.WriteRecord(stream, false, line); werr != nil {
					return werr
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// Record is one parsed log line (partials already joined).
type Record struct {
	Time    time.Time
	Stream  string
	Content []byte // without the trailing newline
}

// ErrMalformed is returned for a line that is not a CRI log record.
var ErrMalformed = errors.New("criolog: malformed record")

// parseRecord splits one raw record (without its newline).
func parseRecord(line []byte) (t time.Time, stream string, partial bool, content []byte, err error) {
	i := bytes.IndexByte(line, ' ')
	if i < 0 {
		return t, "", false, nil, ErrMalformed
	}
	t, err = time.Parse(time.RFC3339Nano, string(line[:i]))
	if err != nil {
		return t, "", false, nil, ErrMalformed
	}
	rest := line[i+1:]
	j := bytes.IndexByte(rest, ' ')
	if j < 0 {
		return t, "", false, nil, ErrMalformed
	}
	stream = string(rest[:j])
	rest = rest[j+1:]
	if len(rest) < 1 || (rest[0] != 'F' && rest[0] != 'P') {
		return t, "", false, nil, ErrMalformed
	}
	partial = rest[0] == 'P'
	if len(rest) >= 2 {
		if rest[1] != ' ' {
			return t, "", false, nil, ErrMalformed
		}
		content = rest[2:]
	}
	return t, stream, partial, content, nil
}

// Reader parses records from a log file, joining P records with the F record
// that ends them. It keeps the byte offset it has consumed so a follower can
// poll for more.
type Reader struct {
	br      *bufio.Reader
	pending map[string]*Record // partial lines per stream
	carry   []byte             // an incomplete raw record at EOF
}

// NewReader reads records from r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64*1024), pending: map[string]*Record{}}
}

// Reset continues reading from r (the next file of a rotated log): lines a
// previous file left partial are completed from it.
func (r *Reader) Reset(rd io.Reader) { r.br.Reset(rd) }

// Next returns the next complete record. It returns io.EOF when no complete
// record is available yet; a follower may call Next again after the file
// grew. Malformed lines are skipped.
func (r *Reader) Next() (Record, error) {
	for {
		raw, err := r.br.ReadBytes('\n')
		if err != nil {
			// Keep an unterminated tail for the next call.
			r.carry = append(r.carry, raw...)
			return Record{}, err
		}
		if len(r.carry) > 0 {
			raw = append(r.carry, raw...)
			r.carry = nil
		}
		t, stream, partial, content, perr := parseRecord(raw[:len(raw)-1])
		if perr != nil {
			continue
		}
		p := r.pending[stream]
		if partial {
			if p == nil {
				p = &Record{Time: t, Stream: stream}
				r.pending[stream] = p
			}
			p.Content = append(p.Content, content...)
			continue
		}
		if p != nil {
			delete(r.pending, stream)
			p.Content = append(p.Content, content...)
			return *p, nil
		}
		return Record{Time: t, Stream: stream, Content: append([]byte(nil), content...)}, nil
	}
}

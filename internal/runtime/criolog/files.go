package criolog

import (
	"bytes"
	"io"
	"os"
	"time"
)

// OpenFiles opens the log at path and its rotated files (see
// Writer.SetRotation), oldest first, the live file last. The live file is
// opened first: if it is rotated meanwhile, the descriptor still reads it
// and its new name is not listed twice. A missing live file is the error.
func OpenFiles(path string) ([]*os.File, error) {
	live, err := os.Open(path)
	// Between the rename and the new file of a rotation the path is
	// briefly missing.
	for try := 0; os.IsNotExist(err) && try < 5 && len(Rotated(path)) > 0; try++ {
		time.Sleep(2 * time.Millisecond)
		live, err = os.Open(path)
	}
	if err != nil {
		return nil, err
	}
	lfi, err := live.Stat()
	if err != nil {
		live.Close()
		return nil, err
	}
	var files []*os.File
	for _, p := range Rotated(path) {
		f, err := os.Open(p)
		if err != nil {
			continue // removed by a rotation meanwhile
		}
		if fi, err := f.Stat(); err != nil || os.SameFile(fi, lfi) {
			f.Close()
			continue
		}
		files = append(files, f)
	}
	return append(files, live), nil
}

// Replaced reports, for a follower at the end of f (the live file when it
// was opened), whether path now names another file (f was rotated): then it
// returns the files that followed f, opened, oldest first: rotated ones
// still there, then the live one. The follower reads f to its end before it
// moves on: the writer renames only after a complete record.
func Replaced(path string, f *os.File) []*os.File {
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	pfi, err := os.Stat(path)
	if err != nil || os.SameFile(fi, pfi) {
		return nil
	}
	all, err := OpenFiles(path)
	if err != nil {
		return nil
	}
	// Keep what comes after f (all of it if f is gone from the list).
	for i, g := range all {
		if gi, err := g.Stat(); err == nil && os.SameFile(gi, fi) {
			for _, h := range all[:i+1] {
				h.Close()
			}
			return all[i+1:]
		}
	}
	return all
}

// TailStart finds where the last n lines of the log made of files (oldest
// first) begin: the index of the file and the offset in it. It reads
// backwards in chunks, so the cost is the size of the tail, not of the log.
// A line is a full (F) record together with the partial (P) records before
// it; an unterminated record at the very end is not counted.
func TailStart(files []*os.File, n int64) (int, int64, error) {
	need := n
	for i := len(files) - 1; i >= 0; i-- {
		off, count, found, err := scanBack(files[i], need)
		if err != nil {
			return 0, 0, err
		}
		if found {
			return i, off, nil
		}
		need -= count
	}
	return 0, 0, nil
}

const (
	tailChunk = 64 << 10
	tailHead  = 128 // enough for "<timestamp> <stream> <tag> "
)

// scanBack looks for the end of the (need+1)-th full record from the end of
// f. Not found, it returns the number of full records f holds.
func scanBack(f *os.File, need int64) (off, count int64, found bool, err error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, false, err
	}
	end := fi.Size()
	buf := make([]byte, tailChunk+tailHead)
	var next []byte // the first bytes after end, already scanned
	laterNL := int64(-1)
	// check counts the complete line starting at start (bytes b from
	// there) and ending at laterNL.
	check := func(b []byte) bool {
		if laterNL < 0 || !isFull(b) {
			return false
		}
		count++
		return count == need+1
	}
	for end > 0 {
		start := max(0, end-tailChunk)
		n := int(end - start)
		if _, err := f.ReadAt(buf[:n], start); err != nil && err != io.EOF {
			return 0, 0, false, err
		}
		b := append(buf[:n], next...)
		for i := n - 1; i >= 0; i-- {
			if b[i] != '\n' {
				continue
			}
			if check(b[i+1:]) {
				return laterNL + 1, count, true, nil
			}
			laterNL = start + int64(i)
		}
		if start == 0 && check(b) {
			return laterNL + 1, count, true, nil
		}
		next = append([]byte(nil), b[:min(len(b), tailHead)]...)
		end = start
	}
	return 0, count, false, nil
}

// isFull: b starts with a record whose tag is F.
func isFull(b []byte) bool {
	i := bytes.IndexByte(b, ' ')
	if i < 0 {
		return false
	}
	b = b[i+1:]
	j := bytes.IndexByte(b, ' ')
	if j < 0 || j+1 >= len(b) {
		return false
	}
	return b[j+1] == 'F'
}

// Tail is the content of the last lines records of the log at path (its
// rotated files included), newline-terminated, cut to its last maxBytes:
// what the kubelet reports as a failed container's termination message
// under FallbackToLogsOnError. A missing log is "".
func Tail(path string, lines int64, maxBytes int) (string, error) {
	files, err := OpenFiles(path)
	if os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	cur, off, err := TailStart(files, lines)
	if err != nil {
		return "", err
	}
	if _, err := files[cur].Seek(off, io.SeekStart); err != nil {
		return "", err
	}
	var out []byte
	r := NewReader(files[cur])
	for {
		rec, err := r.Next()
		if err == io.EOF && cur < len(files)-1 {
			cur++
			r.Reset(files[cur])
			continue
		}
		if err != nil {
			break
		}
		out = append(append(out, rec.Content...), '\n')
		if len(out) > 2*maxBytes {
			out = out[len(out)-maxBytes:]
		}
	}
	if len(out) > maxBytes {
		out = out[len(out)-maxBytes:]
	}
	return string(out), nil
}

// Package execfile copies the binaries a benchmark measures into a work
// dir of its own, so that their pages are shared only among the measured
// processes (PSS).
package execfile

import (
	"io"
	"os"
)

// Copy writes src to dst as an executable file.
func Copy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

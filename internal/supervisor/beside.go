package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Beside finds the helper program name (k3sm-runtimed, k3sm-netd,
// k3sm-helm, k3sm-shim) in the directory of exe, the running executable:
// helpers are built (bin/) and installed beside it. It returns the
// helper's path if that is an executable file; otherwise an error naming
// the path and how to build it (every helper is cmd/<name>, built by
// `make bin/<name>`), which callers prefix with what needs it.
func Beside(exe, name string) (string, error) {
	p := filepath.Join(filepath.Dir(exe), name)
	fi, err := os.Stat(p)
	var problem string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		problem = p + " not found"
	case err != nil:
		problem = err.Error()
	case fi.IsDir() || fi.Mode()&0o111 == 0:
		problem = p + " is not an executable file"
	default:
		return p, nil
	}
	return "", fmt.Errorf("%s: build it (make bin/%s, or go build -o %s ./cmd/%s)", problem, name, p, name)
}

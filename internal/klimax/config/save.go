package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"

	"go.yaml.in/yaml/v3"
)

const header = "# klimax configuration. Edit with `klimax config edit`; unknown keys are rejected.\n"

// Marshal renders c as YAML with a short header comment.
func Marshal(c *Config) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(header)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Save validates c and writes it atomically to path with mode 0600 (the file
// may hold registry credentials).
func Save(path string, c *Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	data, err := Marshal(c)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o600)
}

// EditFunc opens path in an editor and returns when the user is done.
type EditFunc func(ctx context.Context, path string) error

// EditorCommand returns an EditFunc that runs $VISUAL, $EDITOR or vi (the
// variable may carry arguments, e.g. "code -w") on the terminal.
func EditorCommand(stdin io.Reader, stdout, stderr io.Writer) EditFunc {
	return func(ctx context.Context, path string) error {
		ed := os.Getenv("VISUAL")
		if ed == "" {
			ed = os.Getenv("EDITOR")
		}
		if ed == "" {
			ed = "vi"
		}
		argv := strings.Fields(ed)
		cmd := exec.CommandContext(ctx, argv[0], append(argv[1:], path)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("editor %q: %w", ed, err)
		}
		return nil
	}
}

// ErrNoChange is returned by Edit when the user saved nothing new.
var ErrNoChange = errors.New("no changes")

// EditOptions tune Edit.
type EditOptions struct {
	// Retry is asked after an invalid edit; returning true reopens the editor
	// on the same (invalid) text. Nil means never retry.
	Retry func(err error) bool
}

// Edit lets the user edit the config at path on a temporary copy. The copy is
// parsed and validated; only a valid result replaces path (atomically, 0600).
// On an invalid edit the original file is untouched and the edited copy is
// kept; its path is in the returned error so no typing is lost.
func Edit(ctx context.Context, path string, edit EditFunc, opts EditOptions) (*Config, error) {
	orig, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if orig, err = Marshal(Default()); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".config-edit-*.yaml")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	_ = f.Chmod(0o600)
	_, werr := f.Write(orig)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp)
		return nil, errors.Join(werr, cerr)
	}
	for {
		if err := edit(ctx, tmp); err != nil {
			return nil, fmt.Errorf("%w (your edits, if any, are in %s)", err, tmp)
		}
		edited, err := os.ReadFile(tmp)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(edited, orig) {
			os.Remove(tmp)
			return nil, ErrNoChange
		}
		c, perr := Parse(edited)
		if perr == nil {
			if err := atomicfile.WriteFile(path, edited, 0o600); err != nil {
				return nil, fmt.Errorf("save %s: %w (your edits are in %s)", path, err, tmp)
			}
			os.Remove(tmp)
			return c, nil
		}
		if opts.Retry != nil && opts.Retry(perr) {
			continue
		}
		return nil, fmt.Errorf("%w\n%s was left unchanged; your edits are kept in %s", perr, path, tmp)
	}
}

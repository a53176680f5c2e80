package volume

import "errors"

// ErrNoTmpfs: the runtime cannot mount a tmpfs here (a rootless runtime,
// darwin); a memory-medium emptyDir is then a directory on disk.
var ErrNoTmpfs = errors.New("no tmpfs: this runtime cannot mount one (rootless, or not Linux)")

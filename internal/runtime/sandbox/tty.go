package sandbox

import (
	"fmt"
	"regexp"
)

// ttyDevice is a darwin pseudo-terminal's device path.
var ttyDevice = regexp.MustCompile(`^/dev/ttys[0-9]+$`)

// WithTTY returns s for a process that runs on the terminal tty (`tty:
// true`, `kubectl exec -t`; tty is the device the caller opened, e.g.
// (*os.File).Name() of the pty's terminal end): with a Seatbelt profile, a
// copy whose profile also allows that one terminal. A profile never
// allows terminals in general, since every pod's exec sessions are
// terminals of the same user and one pod could type into another's.
// Without a profile (Linux) s is returned as it is.
func WithTTY(s *Spec, tty string) (*Spec, error) {
	if s == nil || s.Seatbelt == "" {
		return s, nil
	}
	if !ttyDevice.MatchString(tty) {
		return nil, fmt.Errorf("sandbox: terminal %q is not a pseudo-terminal device (/dev/ttysN)", tty)
	}
	c := *s
	// The path matched ttyDevice: nothing in it needs escaping.
	c.Seatbelt += "; The process's own terminal.\n" +
		`(allow file-read* file-write-data file-ioctl (literal "` + tty + `"))` + "\n"
	return &c, nil
}

package sandbox

import (
	"strings"
	"testing"
)

func TestWithTTY(t *testing.T) {
	base := &Spec{Seatbelt: "(version 1)\n(deny default)\n", UID: 7}
	s, err := WithTTY(base, "/dev/ttys004")
	if err != nil {
		t.Fatal(err)
	}
	want := base.Seatbelt + "; The process's own terminal.\n(allow file-read* file-write-data file-ioctl (literal \"/dev/ttys004\"))\n"
	if s.Seatbelt != want || s.UID != 7 {
		t.Errorf("got %+v", s)
	}
	if strings.Contains(base.Seatbelt, "ttys") {
		t.Error("WithTTY changed the Spec it was given")
	}
	for _, bad := range []string{"/dev/ttys", "/dev/ttys1/../disk0", "/dev/disk0", `/dev/ttys1"))(allow default`} {
		if _, err := WithTTY(base, bad); err == nil {
			t.Errorf("WithTTY(%q) accepted", bad)
		}
	}
	// No profile (Linux, or no sandbox): unchanged, whatever the terminal.
	for _, s := range []*Spec{nil, {UID: 1}} {
		if got, err := WithTTY(s, "/dev/pts/3"); err != nil || got != s {
			t.Errorf("WithTTY(%v) = %v, %v", s, got, err)
		}
	}
}

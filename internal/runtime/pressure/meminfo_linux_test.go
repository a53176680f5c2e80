//go:build linux

package pressure

import (
	"strings"
	"testing"
)

func TestParseMeminfo(t *testing.T) {
	m, err := parseMeminfo([]byte("MemTotal:       24683584 kB\nMemFree:        12533104 kB\nMemAvailable:   23821844 kB\n"))
	if err != nil || m.TotalBytes != 24683584*1024 || m.AvailableBytes != 23821844*1024 {
		t.Errorf("%+v %v", m, err)
	}
	if _, err := parseMeminfo([]byte("MemTotal: 1 kB\n")); err == nil || !strings.Contains(err.Error(), "MemAvailable") {
		t.Errorf("without MemAvailable: %v", err)
	}
}

// The real /proc/meminfo of this machine.
func TestReadMemory(t *testing.T) {
	m, err := ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	if m.TotalBytes < 64<<20 || m.AvailableBytes == 0 || m.AvailableBytes > m.TotalBytes {
		t.Errorf("implausible: %+v", m)
	}
}

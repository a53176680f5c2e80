package units

import "testing"

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0:                "0 B",
		1023:             "1023 B",
		1024:             "1.0 KiB",
		1536:             "1.5 KiB",
		1 << 20:          "1.0 MiB",
		10 << 30:         "10.0 GiB",
		50<<30 + 100<<20: "50.1 GiB",
		2 << 40:          "2.0 TiB",
		1<<62 + 1<<61:    "6.0 EiB",
		-5:               "-5 B",
	} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

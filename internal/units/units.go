// Package units formats quantities for people, the one way both binaries
// do it. It imports only the standard library, so any package may use it.
package units

import "fmt"

// Bytes renders n bytes with binary units and one decimal: "512 B",
// "1.5 KiB", "79.0 MiB", "2.0 TiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

//go:build !linux && !darwin

package image

import "fmt"

func statfs(string) (uint64, uint64) { return 0, 0 }

func mkfifo(path string, _ uint32) error {
	return fmt.Errorf("%s: a layer's fifo cannot be made on this system", path)
}

//go:build !linux && !darwin

package pressure

func readMemory() (Memory, error) { return Memory{}, ErrUnsupported }

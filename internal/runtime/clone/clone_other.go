//go:build !linux && !darwin

package clone

import "io/fs"

// Fallback for other systems: always copy.
func treeNative(src, dst string) (Method, bool, error) { return "", false, nil }

func reflinkFile(src, dst string, mode fs.FileMode) (bool, error) { return false, errNoClone }

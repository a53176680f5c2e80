//go:build !linux && !darwin

package stats

// processGroups elsewhere: not implemented.
func processGroups(pgids []int) (map[int]Sample, error) { return nil, ErrUnsupported }

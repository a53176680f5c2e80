//go:build !linux

package stats

// processGroups on darwin and others: the seam for proc_pid_rusage.
func processGroups(pgids []int) (map[int]Sample, error) { return nil, ErrUnsupported }

package pod

// The one doubling back-off CrashLoopBackOff and ImagePullBackOff step
// through, kept apart so that a shared back-off type can replace it.

import "time"

// nextBackOff is the delay after prev in a back-off that starts at base
// and doubles up to limit; prev 0 (none yet, or reset) gives base.
func nextBackOff(prev, base, limit time.Duration) time.Duration {
	if prev == 0 {
		return base
	}
	return min(2*prev, limit)
}

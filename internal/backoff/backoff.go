// Package backoff is k3sm's one doubling back-off: restart and retry delays
// that start at Initial and double up to Max. It uses only the standard
// library, so every part of the tree (the supervisor, the runtime daemon,
// the agent) can import it.
package backoff

import "time"

// Backoff hands out delays Initial, 2*Initial, 4*Initial ... capped at Max.
// The zero value's delays are all 0. It is not safe for concurrent use: a
// caller keeps one per thing it retries, under that thing's lock.
type Backoff struct {
	Initial, Max time.Duration
	cur          time.Duration // the last delay Next returned; 0 before the first or after Reset
}

// Next returns the next delay: Initial first and after Reset, then twice
// the previous one, at most Max.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Initial
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	return b.cur
}

// Delay returns the delay Next last returned, or 0 after Reset (or before
// the first Next): for a back-off whose first retry is immediate, wait
// Delay() and then call Next.
func (b *Backoff) Delay() time.Duration { return b.cur }

// Reset starts over: the next Next returns Initial.
func (b *Backoff) Reset() { b.cur = 0 }

package kubeconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/k3sm-dev/k3sm/internal/backoff"
)

// lockTimeout is how long a writer waits for another one's lock. kubectl
// holds it for milliseconds, so a lock older than this was left by a
// process that died while writing.
var lockTimeout = 10 * time.Second

// lockFile takes the kubeconfig lock the way client-go's clientcmd (and so
// kubectl) does: create <path>.lock exclusively, remove it to unlock. Any
// other protocol (an flock on a file that stays) leaves a file that kubectl
// then reads as "locked" forever.
func lockFile(path string) (func(), error) {
	lock := path + ".lock"
	deadline := time.Now().Add(lockTimeout)
	delay := backoff.Backoff{Initial: 5 * time.Millisecond, Max: 200 * time.Millisecond}
	for {
		f, err := os.OpenFile(lock, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			f.Close()
			return func() { _ = os.Remove(lock) }, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("lock kubeconfig: %w", err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("kubeconfig %s is locked: %s exists (another kubectl, k3sm or klimax is writing it, "+
				"or one crashed while writing); if none is running, remove %s and retry", path, lock, lock)
		}
		time.Sleep(delay.Next())
	}
}

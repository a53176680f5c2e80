package node

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
)

// eventPosSpacing is the shortest time between two writes of the position.
//
// The runtime buffers its pods' events per boot and replays those after the
// position a watch names; a node that starts from nothing gets them all
// again and would post every Pulled, Created and Started a second time. The
// position is written on every change, but at most every eventPosSpacing
// (an atomic write costs two fsyncs; a burst of pods makes hundreds of events
// a second) and once more when the node stops. So only a node killed with
// SIGKILL can post again the events of its last eventPosSpacing, and only
// those it had read by then; the events recorder posts asynchronously
// anyway, so a kill can as well lose the last few. 250 ms keeps that window
// smaller than what a person or test sees as "the events of a start".
const eventPosSpacing = 250 * time.Millisecond

type watchPos struct {
	BootID string `json:"bootId"`
	Seq    uint64 `json:"seq"`
}

// eventPos keeps a watchPos in a file, debounced.
type eventPos struct {
	path string
	log  *slog.Logger
	mu   sync.Mutex
	cur  watchPos
	disk watchPos
	kick chan struct{}
}

// loadEventPos reads the position kept at path (the zero position when
// there is none or it does not parse).
func loadEventPos(path string, log *slog.Logger) *eventPos {
	e := &eventPos{path: path, log: log, kick: make(chan struct{}, 1)}
	data, err := os.ReadFile(path)
	if err == nil {
		var pos watchPos
		if err := json.Unmarshal(data, &pos); err != nil {
			log.Warn("runtime event position unreadable; starting from the oldest buffered event", "file", path, "err", err)
		} else {
			e.cur, e.disk = pos, pos
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		log.Warn("reading runtime event position", "file", path, "err", err)
	}
	return e
}

func (e *eventPos) get() watchPos {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// set records a new position; run writes it.
func (e *eventPos) set(pos watchPos) {
	e.mu.Lock()
	changed := e.cur != pos
	e.cur = pos
	e.mu.Unlock()
	if changed {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

// run writes the position when it changes, at most every eventPosSpacing,
// and a last time when ctx ends.
func (e *eventPos) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			e.flush()
			return
		case <-e.kick:
		}
		e.flush()
		select {
		case <-ctx.Done():
			e.flush()
			return
		case <-time.After(eventPosSpacing):
		}
	}
}

// flush writes the position unless the file has it already.
func (e *eventPos) flush() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cur == e.disk {
		return
	}
	data, _ := json.Marshal(e.cur)
	if err := atomicfile.WriteFile(e.path, data, 0o600); err != nil {
		e.log.Warn("keeping runtime event position", "file", e.path, "err", err)
		return
	}
	e.disk = e.cur
}

package pod

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// eventRing is how many events the manager keeps for watchers that
// (re)connect later: PodReattached is emitted before any provider watches.
const eventRing = 4096

// hub fans pod changes and events out to watchers without ever blocking
// the lifecycle: a watcher has a set of dirty pods and a cursor into the
// event ring, and a single-slot notification channel.
type hub struct {
	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	events  []*runtimev1.PodEvent // ring, oldest first
	nextSeq uint64
}

// Subscription is one watcher.
type Subscription struct {
	h       *hub
	notify  chan struct{}
	dirty   map[string]bool
	deleted map[string]*runtimev1.PodStatus
	after   uint64 // last event seq delivered
}

func newHub() *hub { return &hub{subs: map[*Subscription]struct{}{}, nextSeq: 1} }

func (h *hub) emit(ev *runtimev1.PodEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ev.Seq = h.nextSeq
	h.nextSeq++
	if ev.Time == nil {
		ev.Time = timestamppb.New(time.Now())
	}
	if len(h.events) >= eventRing {
		h.events = h.events[1:]
	}
	h.events = append(h.events, ev)
	for s := range h.subs {
		s.ping()
	}
}

func (h *hub) changed(uid string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.dirty[uid] = true
		s.ping()
	}
}

func (h *hub) removed(last *runtimev1.PodStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		delete(s.dirty, last.GetUid())
		s.deleted[last.GetUid()] = last
		s.ping()
	}
}

func (s *Subscription) ping() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// subscribe registers a watcher whose event cursor starts after seq.
func (h *hub) subscribe(after uint64) *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &Subscription{h: h, notify: make(chan struct{}, 1), dirty: map[string]bool{}, deleted: map[string]*runtimev1.PodStatus{}, after: after}
	h.subs[s] = struct{}{}
	s.ping()
	return s
}

// C is signalled when there is something to Take.
func (s *Subscription) C() <-chan struct{} { return s.notify }

// Take returns the pods changed and deleted and the new events since the
// last call.
func (s *Subscription) Take() (changed []string, deleted []*runtimev1.PodStatus, events []*runtimev1.PodEvent) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	for uid := range s.dirty {
		changed = append(changed, uid)
	}
	s.dirty = map[string]bool{}
	for _, st := range s.deleted {
		deleted = append(deleted, st)
	}
	s.deleted = map[string]*runtimev1.PodStatus{}
	for _, ev := range h.events {
		if ev.Seq > s.after {
			events = append(events, ev)
		}
	}
	if len(events) > 0 {
		s.after = events[len(events)-1].Seq
	}
	return changed, deleted, events
}

// Close unregisters the watcher.
func (s *Subscription) Close() {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	delete(s.h.subs, s)
}

package pod

// Update: a pod's new spec, which containers restart for it
// (definitionChanged), and the env that waits for a container's next
// start.

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// Update replaces the pod's spec; containers whose definition changed (see
// definitionChanged) restart with it. A container that does not restart
// keeps the env it runs with and starts next time with the new one.
func (m *Manager) Update(spec *runtimev1.PodSpec) (*runtimev1.PodStatus, error) {
	if err := validate(spec); err != nil {
		return nil, err
	}
	p := m.get(spec.GetUid())
	if p == nil {
		return nil, fmt.Errorf("pod %s: %w", spec.GetUid(), ErrNotFound)
	}
	if spec.GetName() != p.name || spec.GetNamespace() != p.namespace {
		return nil, &InvalidSpecError{fmt.Sprintf("pod %s: name and namespace cannot change (%s/%s -> %s/%s)", p.uid, p.namespace, p.name, spec.GetNamespace(), spec.GetName())}
	}
	spec = proto.Clone(spec).(*runtimev1.PodSpec)
	p.mu.Lock()
	added := p.mergeEphemeralLocked(spec)
	p.spec = spec
	byName := map[string]*runtimev1.ContainerSpec{}
	for _, c := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		byName[c.GetName()] = c
	}
	for _, c := range p.all() {
		nc, ok := byName[c.spec.GetName()]
		if !ok {
			continue
		}
		changed := definitionChanged(c.spec, nc)
		c.nextEnv, c.envPending = nil, false
		if !changed && !proto.Equal(&runtimev1.ContainerSpec{Env: c.spec.GetEnv()}, &runtimev1.ContainerSpec{Env: nc.GetEnv()}) {
			// The env a container was started with stays in its spec
			// (exec, probes and pod.json see what its process has); the
			// new env is for its next start (applyNextEnv), where the
			// kubelet would resolve it.
			c.nextEnv, c.envPending = nc.GetEnv(), true
			nc.Env = c.spec.GetEnv()
		}
		c.spec = nc
		// A refused container (CreateContainerConfigError) never started:
		// as the kubelet's sync on a pod update, it tries again with what
		// changed (a subPathExpr's annotation, its env).
		refused := c.proc == nil && c.state.Waiting != nil && c.state.Waiting.Reason == "CreateContainerConfigError"
		if changed && !(c.init && c.succeeded()) {
			c.changed = true
		}
		if (changed && !(c.init && c.succeeded())) || refused {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	p.mu.Unlock()
	if added {
		p.startEphemeral()
	}
	p.changedNotify()
	return p.status(), nil
}

// definitionChanged reports that a running container must stop and start
// again for the new spec b. The kubelet decides that from its container
// hash, over the API spec; a provider that sends it (definition_hash)
// gets exactly that: a change of what the provider resolves (env from
// labels, annotations, ConfigMaps, Secrets) restarts nothing, and only
// reaches the container when it starts again. Without a hash (an older
// provider) the resolved fields are compared, as v1 always did; a running
// container from before the provider sent hashes is compared without env,
// whose resolution changed meaning with the hash (verbatim values).
func definitionChanged(a, b *runtimev1.ContainerSpec) bool {
	ha, hb := a.GetDefinitionHash(), b.GetDefinitionHash()
	switch {
	case ha != "" && hb != "":
		return ha != hb
	case hb != "":
		return !proto.Equal(stripDefinition(a, false), stripDefinition(b, false))
	}
	return !proto.Equal(stripDefinition(a, true), stripDefinition(b, true))
}

// applyNextEnv gives c the env of the last update, for the attempt about to
// start. Caller holds p.mu. The pod spec is replaced, not changed in place:
// readers outside the lock keep the one they took.
func (p *managedPod) applyNextEnv(c *container) {
	spec := proto.Clone(p.spec).(*runtimev1.PodSpec)
	byName := map[string]*runtimev1.ContainerSpec{}
	for _, x := range append(append([]*runtimev1.ContainerSpec{}, spec.GetInitContainers()...), spec.GetContainers()...) {
		byName[x.GetName()] = x
	}
	for _, x := range p.all() {
		if s, ok := byName[x.name]; ok {
			x.spec = s
		}
	}
	if s, ok := byName[c.name]; ok {
		s.Env = c.nextEnv
	} else {
		cs := proto.Clone(c.spec).(*runtimev1.ContainerSpec)
		cs.Env = c.nextEnv
		c.spec = cs
	}
	p.spec = spec
	c.nextEnv, c.envPending = nil, false
}

// stripDefinition keeps the fields whose change restarts a container of an
// older provider (one that sends no definition_hash).
func stripDefinition(c *runtimev1.ContainerSpec, env bool) *runtimev1.ContainerSpec {
	s := &runtimev1.ContainerSpec{Name: c.GetName(), Image: c.GetImage(), ImagePullPolicy: c.GetImagePullPolicy(),
		Command: c.GetCommand(), Args: c.GetArgs(), WorkingDir: c.GetWorkingDir()}
	if env {
		s.Env = c.GetEnv()
	}
	return s
}

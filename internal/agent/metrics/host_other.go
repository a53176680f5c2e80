//go:build !linux

package metrics

// HostUsage is not implemented here yet (on darwin it comes with the
// host_statistics sampler on the roadmap); the node's usage is then the sum
// of its containers'.
func HostUsage() (Usage, error) { return Usage{}, ErrUnsupported }

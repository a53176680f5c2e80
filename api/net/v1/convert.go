package v1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// FromUnstructured decodes a MeshPeer the dynamic client returned. It
// refuses another kind, and fields of the wrong type; it does not
// Validate.
func FromUnstructured(u *unstructured.Unstructured) (*MeshPeer, error) {
	if gvk := u.GroupVersionKind(); gvk != MeshPeerGVK {
		return nil, fmt.Errorf("%s %q is not a %s", gvk, u.GetName(), MeshPeerGVK)
	}
	p := new(MeshPeer)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), p); err != nil {
		return nil, fmt.Errorf("MeshPeer %q: %w", u.GetName(), err)
	}
	return p, nil
}

// ToUnstructured encodes p for the dynamic client, with its apiVersion and
// kind set.
func ToUnstructured(p *MeshPeer) (*unstructured.Unstructured, error) {
	c := p.DeepCopy()
	c.APIVersion, c.Kind = SchemeGroupVersion.String(), Kind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
	if err != nil {
		return nil, fmt.Errorf("MeshPeer %q: %w", p.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// StatusToUnstructured encodes a status as the value of an object's
// "status" field.
func StatusToUnstructured(s *MeshPeerStatus) (map[string]any, error) {
	return runtime.DefaultUnstructuredConverter.ToUnstructured(s)
}

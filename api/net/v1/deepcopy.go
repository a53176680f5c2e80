package v1

import "k8s.io/apimachinery/pkg/runtime"

// DeepCopyInto copies p into out.
func (p *MeshPeer) DeepCopyInto(out *MeshPeer) {
	*out = *p
	out.TypeMeta = p.TypeMeta
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	p.Spec.DeepCopyInto(&out.Spec)
	p.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a copy of p.
func (p *MeshPeer) DeepCopy() *MeshPeer {
	if p == nil {
		return nil
	}
	out := new(MeshPeer)
	p.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (p *MeshPeer) DeepCopyObject() runtime.Object {
	if c := p.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies s into out.
func (s *MeshPeerSpec) DeepCopyInto(out *MeshPeerSpec) {
	*out = *s
	if s.AllowedIPs != nil {
		out.AllowedIPs = append([]string(nil), s.AllowedIPs...)
	}
}

// DeepCopy returns a copy of s.
func (s *MeshPeerSpec) DeepCopy() *MeshPeerSpec {
	if s == nil {
		return nil
	}
	out := new(MeshPeerSpec)
	s.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies s into out.
func (s *MeshPeerStatus) DeepCopyInto(out *MeshPeerStatus) {
	*out = *s
	if s.LastHandshakeTime != nil {
		out.LastHandshakeTime = s.LastHandshakeTime.DeepCopy()
	}
	if s.Peers != nil {
		out.Peers = make([]PeerStatus, len(s.Peers))
		for i := range s.Peers {
			s.Peers[i].DeepCopyInto(&out.Peers[i])
		}
	}
}

// DeepCopy returns a copy of s.
func (s *MeshPeerStatus) DeepCopy() *MeshPeerStatus {
	if s == nil {
		return nil
	}
	out := new(MeshPeerStatus)
	s.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies s into out.
func (s *PeerStatus) DeepCopyInto(out *PeerStatus) {
	*out = *s
	if s.LastHandshakeTime != nil {
		out.LastHandshakeTime = s.LastHandshakeTime.DeepCopy()
	}
}

// DeepCopy returns a copy of s.
func (s *PeerStatus) DeepCopy() *PeerStatus {
	if s == nil {
		return nil
	}
	out := new(PeerStatus)
	s.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies l into out.
func (l *MeshPeerList) DeepCopyInto(out *MeshPeerList) {
	*out = *l
	out.TypeMeta = l.TypeMeta
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]MeshPeer, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l.
func (l *MeshPeerList) DeepCopy() *MeshPeerList {
	if l == nil {
		return nil
	}
	out := new(MeshPeerList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *MeshPeerList) DeepCopyObject() runtime.Object {
	if c := l.DeepCopy(); c != nil {
		return c
	}
	return nil
}

package podspec

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"sort"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trustBundle is a clusterTrustBundle projection's file: the certificates
// of the named bundle, or of every bundle of the signer whose labels match
// (a nil selector matches none, an empty one all), each certificate once,
// as the kubelet writes it. optional: a missing bundle, or none matching,
// is an empty file; otherwise the pod waits (FailedMount).
func (t *Translator) trustBundle(ctx context.Context, p *corev1.ClusterTrustBundleProjection) ([]byte, error) {
	optional := p.Optional != nil && *p.Optional
	var bundles []certificatesv1.ClusterTrustBundle
	switch {
	case p.Name != nil:
		b, err := t.src.ClusterTrustBundle(ctx, *p.Name)
		if apierrors.IsNotFound(err) && optional {
			return []byte{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("clusterTrustBundle %q: %w", *p.Name, err)
		}
		bundles = append(bundles, *b)
	case p.SignerName != nil:
		if p.LabelSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.LabelSelector)
			if err != nil {
				return nil, fmt.Errorf("clusterTrustBundle labelSelector: %w", err)
			}
			if bundles, err = t.src.ClusterTrustBundles(ctx, *p.SignerName, sel); err != nil {
				return nil, fmt.Errorf("clusterTrustBundles of signer %q: %w", *p.SignerName, err)
			}
		}
		if len(bundles) == 0 {
			if optional {
				return []byte{}, nil
			}
			return nil, fmt.Errorf("clusterTrustBundle: signerName %q and labelSelector %v matched zero ClusterTrustBundles", *p.SignerName, p.LabelSelector)
		}
	default:
		return nil, errors.New("clusterTrustBundle projection needs name or signerName")
	}
	seen := map[string]bool{}
	var ders []string
	for _, b := range bundles {
		rest := []byte(b.Spec.TrustBundle)
		for {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			if !seen[string(blk.Bytes)] {
				seen[string(blk.Bytes)] = true
				ders = append(ders, string(blk.Bytes))
			}
		}
	}
	// A stable order, so that a refresh rewrites the file only when a
	// bundle changed (the kubelet shuffles once per start).
	sort.Strings(ders)
	var out bytes.Buffer
	for _, d := range ders {
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: []byte(d)})
	}
	return out.Bytes(), nil
}

package podspec

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// defaultFileMode is the kubelet's mode for volume files without one.
const defaultFileMode = 0o644

// hostPathAllowed is k3sm's hostPath rule: any host path is allowed (namespace
// policy is Pod Security admission's job, as upstream) except paths inside
// k3sm's own data directory, which holds the cluster's database, private
// keys and every other pod's files.
func (t *Translator) hostPathAllowed(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("hostPath %q is not an absolute path", path)
	}
	for _, d := range t.protectedDirs {
		if within(path, d) || within(d, path) {
			return fmt.Errorf("hostPath %s is refused: it is or contains k3sm's data directory %s (the cluster's database, keys and other pods' files); "+
				"use a path outside it, or a PersistentVolumeClaim (storageClassName local-path)", path, d)
		}
	}
	return nil
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// volumes resolves the pod's volumes. With filesOnly only configMap, secret,
// downwardAPI and projected volumes are resolved (the periodic refresh).
func (t *Translator) volumes(ctx context.Context, pod *corev1.Pod, filesOnly bool) ([]*runtimev1.Volume, error) {
	var out []*runtimev1.Volume
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		rv := &runtimev1.Volume{Name: v.Name}
		var files []*runtimev1.VolumeFile
		var err error
		isFiles := true
		switch {
		case v.ConfigMap != nil:
			files, err = t.configMapFiles(ctx, pod, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
		case v.Secret != nil:
			files, err = t.secretFiles(ctx, pod, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
		case v.DownwardAPI != nil:
			files, err = t.downwardFiles(pod, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
		case v.Projected != nil:
			files, err = t.projectedFiles(ctx, pod, v.Name, v.Projected)
		default:
			isFiles = false
		}
		if isFiles {
			if err != nil {
				return nil, &VolumeError{v.Name, err}
			}
			rv.Source = &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: files}}
			out = append(out, rv)
			continue
		}
		if filesOnly {
			continue
		}
		switch {
		case v.EmptyDir != nil:
			ed := &runtimev1.EmptyDirVolume{Memory: v.EmptyDir.Medium == corev1.StorageMediumMemory}
			if v.EmptyDir.SizeLimit != nil {
				ed.SizeLimitBytes = v.EmptyDir.SizeLimit.Value()
			}
			rv.Source = &runtimev1.Volume_EmptyDir{EmptyDir: ed}
		case v.HostPath != nil:
			if err := t.hostPathAllowed(v.HostPath.Path); err != nil {
				return nil, &VolumeError{v.Name, err}
			}
			typ := ""
			if v.HostPath.Type != nil {
				typ = string(*v.HostPath.Type)
			}
			rv.Source = &runtimev1.Volume_HostPath{HostPath: &runtimev1.HostPathVolume{Path: v.HostPath.Path, Type: typ}}
		case v.PersistentVolumeClaim != nil:
			if err := t.claimVolume(ctx, pod.Namespace, v.PersistentVolumeClaim.ClaimName, rv); err != nil {
				return nil, &VolumeError{v.Name, err}
			}
		case v.Ephemeral != nil:
			// The ephemeral volume controller names the claim <pod>-<volume>.
			if err := t.claimVolume(ctx, pod.Namespace, pod.Name+"-"+v.Name, rv); err != nil {
				return nil, &VolumeError{v.Name, err}
			}
		default:
			return nil, &VolumeError{v.Name, fmt.Errorf("this volume type is not supported by k3sm's native pods; supported: emptyDir, configMap, secret, downwardAPI, projected, hostPath, persistentVolumeClaim (storageClassName local-path), ephemeral")}
		}
		out = append(out, rv)
	}
	return out, nil
}

// claimVolume resolves a PersistentVolumeClaim to the directory of its bound
// PersistentVolume (hostPath, as the local-path provisioner makes them, or
// local).
func (t *Translator) claimVolume(ctx context.Context, ns, claim string, rv *runtimev1.Volume) error {
	pvc, err := t.src.Claim(ctx, ns, claim)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("persistentvolumeclaim %q not found", claim)
		}
		return err
	}
	if pvc.DeletionTimestamp != nil {
		return fmt.Errorf("persistentvolumeclaim %q is being deleted", claim)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return fmt.Errorf("persistentvolumeclaim %q is not bound yet (phase %s)", claim, pvc.Status.Phase)
	}
	pv, err := t.src.Volume(ctx, pvc.Spec.VolumeName)
	if err != nil {
		return fmt.Errorf("persistentvolume %q of claim %q: %w", pvc.Spec.VolumeName, claim, err)
	}
	switch {
	case pv.Spec.HostPath != nil:
		typ := ""
		if pv.Spec.HostPath.Type != nil {
			typ = string(*pv.Spec.HostPath.Type)
		}
		rv.Source = &runtimev1.Volume_HostPath{HostPath: &runtimev1.HostPathVolume{Path: pv.Spec.HostPath.Path, Type: typ}}
		return nil
	case pv.Spec.Local != nil:
		rv.Source = &runtimev1.Volume_LocalPath{LocalPath: &runtimev1.LocalPathVolume{Path: pv.Spec.Local.Path}}
		return nil
	}
	return fmt.Errorf("persistentvolume %q is neither hostPath nor local; k3sm's native pods mount only node-local volumes", pv.Name)
}

func fileMode(item *int32, def *int32) uint32 {
	switch {
	case item != nil:
		return uint32(*item)
	case def != nil:
		return uint32(*def)
	}
	return defaultFileMode
}

// keyFiles turns an object's keys into files: every key, or the items.
func keyFiles(kind, name string, data map[string][]byte, items []corev1.KeyToPath, optional bool, def *int32) ([]*runtimev1.VolumeFile, error) {
	var files []*runtimev1.VolumeFile
	if len(items) == 0 {
		for _, k := range sortedKeys(data) {
			files = append(files, &runtimev1.VolumeFile{Path: k, Content: data[k], Mode: fileMode(nil, def)})
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s %q references non-existent config key: %s", kind, name, it.Key)
		}
		files = append(files, &runtimev1.VolumeFile{Path: it.Path, Content: v, Mode: fileMode(it.Mode, def)})
	}
	return files, nil
}

func (t *Translator) configMapFiles(ctx context.Context, pod *corev1.Pod, name string, items []corev1.KeyToPath, opt *bool, def *int32) ([]*runtimev1.VolumeFile, error) {
	cm, err := t.src.ConfigMap(ctx, pod.Namespace, name)
	if apierrors.IsNotFound(err) {
		if optional(opt) {
			return nil, nil
		}
		return nil, fmt.Errorf("configmap %q not found", name)
	}
	if err != nil {
		return nil, err
	}
	data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles("configmap", name, data, items, optional(opt), def)
}

func (t *Translator) secretFiles(ctx context.Context, pod *corev1.Pod, name string, items []corev1.KeyToPath, opt *bool, def *int32) ([]*runtimev1.VolumeFile, error) {
	s, err := t.src.Secret(ctx, pod.Namespace, name)
	if apierrors.IsNotFound(err) {
		if optional(opt) {
			return nil, nil
		}
		return nil, fmt.Errorf("secret %q not found", name)
	}
	if err != nil {
		return nil, err
	}
	return keyFiles("secret", name, s.Data, items, optional(opt), def)
}

// downwardFiles renders downwardAPI items as the kubelet does (labels and
// annotations as sorted key="value" lines).
func (t *Translator) downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, def *int32) ([]*runtimev1.VolumeFile, error) {
	var files []*runtimev1.VolumeFile
	for _, it := range items {
		var val string
		switch {
		case it.FieldRef != nil:
			switch it.FieldRef.FieldPath {
			case "metadata.labels":
				val = formatMap(pod.Labels)
			case "metadata.annotations":
				val = formatMap(pod.Annotations)
			default:
				v, err := t.fieldRef(pod, it.FieldRef.FieldPath)
				if err != nil {
					return nil, fmt.Errorf("downwardAPI %s: %w", it.Path, err)
				}
				val = v
			}
		case it.ResourceFieldRef != nil:
			var c *corev1.Container
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Name == it.ResourceFieldRef.ContainerName {
					c = &pod.Spec.Containers[i]
				}
			}
			if c == nil {
				return nil, fmt.Errorf("downwardAPI %s: resourceFieldRef names no container of the pod (%q)", it.Path, it.ResourceFieldRef.ContainerName)
			}
			v, err := t.resourceFieldRef(pod, c, it.ResourceFieldRef)
			if err != nil {
				return nil, fmt.Errorf("downwardAPI %s: %w", it.Path, err)
			}
			val = v
		default:
			return nil, fmt.Errorf("downwardAPI %s: neither fieldRef nor resourceFieldRef", it.Path)
		}
		files = append(files, &runtimev1.VolumeFile{Path: it.Path, Content: []byte(val), Mode: fileMode(it.Mode, def)})
	}
	return files, nil
}

func formatMap(m map[string]string) string {
	var b strings.Builder
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

func (t *Translator) projectedFiles(ctx context.Context, pod *corev1.Pod, volume string, p *corev1.ProjectedVolumeSource) ([]*runtimev1.VolumeFile, error) {
	var files []*runtimev1.VolumeFile
	def := p.DefaultMode
	for _, s := range p.Sources {
		var fs []*runtimev1.VolumeFile
		var err error
		switch {
		case s.ConfigMap != nil:
			fs, err = t.configMapFiles(ctx, pod, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, def)
		case s.Secret != nil:
			fs, err = t.secretFiles(ctx, pod, s.Secret.Name, s.Secret.Items, s.Secret.Optional, def)
		case s.DownwardAPI != nil:
			fs, err = t.downwardFiles(pod, s.DownwardAPI.Items, def)
		case s.ServiceAccountToken != nil:
			var tok string
			tok, err = t.token(ctx, pod, volume, s.ServiceAccountToken)
			fs = []*runtimev1.VolumeFile{{Path: s.ServiceAccountToken.Path, Content: []byte(tok), Mode: fileMode(nil, def)}}
		case s.ClusterTrustBundle != nil:
			var pem []byte
			pem, err = t.trustBundle(ctx, s.ClusterTrustBundle)
			fs = []*runtimev1.VolumeFile{{Path: s.ClusterTrustBundle.Path, Content: pem, Mode: fileMode(nil, def)}}
		default:
			err = fmt.Errorf("projected source not supported by k3sm's native pods (supported: configMap, secret, downwardAPI, serviceAccountToken, clusterTrustBundle)")
		}
		if err != nil {
			return nil, err
		}
		files = append(files, fs...)
	}
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.Path] {
			return nil, fmt.Errorf("projected sources both write %s", f.Path)
		}
		seen[f.Path] = true
	}
	return files, nil
}

// volumeMounts translates a container's mounts; a claim mounted readOnly at
// the pod level is read-only in every container.
func volumeMounts(pod *corev1.Pod, c *corev1.Container) []*runtimev1.VolumeMount {
	roClaims := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly {
			roClaims[v.Name] = true
		}
	}
	var out []*runtimev1.VolumeMount
	for _, m := range c.VolumeMounts {
		out = append(out, &runtimev1.VolumeMount{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly || roClaims[m.Name],
			SubPath: m.SubPath, SubPathExpr: m.SubPathExpr})
	}
	return out
}

// HasFilesVolumes: the pod has volumes the periodic refresh rewrites.
func HasFilesVolumes(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
		return v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil || v.Projected != nil
	})
}

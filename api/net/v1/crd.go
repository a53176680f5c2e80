package v1

import _ "embed"

// CRD is the MeshPeer CustomResourceDefinition (apiextensions.k8s.io/v1,
// YAML) the server installs.
//
//go:embed meshpeer-crd.yaml
var CRD []byte

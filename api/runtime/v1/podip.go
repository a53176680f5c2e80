package runtimev1

// PodIPPlaceholder stands for the pod's own address in EnvVar values with
// pod_ip set. It cannot occur in a real environment value: a process
// environment cannot carry NUL bytes.
const PodIPPlaceholder = "\x00k3sm:podIP\x00"

package node

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// containerLogs serves GET /containerLogs/{namespace}/{pod}/{container}
// as the kubelet does: the query read as a v1.PodLogOptions, and a
// refusal written as the kubelet writes it, the reason alone ("container
// "app" in pod "web" is waiting to start: CrashLoopBackOff"), 404 for a
// pod or container the node does not have and 400 otherwise. Virtual
// Kubelet's own handler prefixes every error with its words and the gRPC
// status, which kubectl then prints to the user.
func (p *Provider) containerLogs(w http.ResponseWriter, req *http.Request) {
	o, err := logOptions(req.URL.Query())
	if err != nil {
		http.Error(w, "unable to decode query: "+err.Error(), http.StatusBadRequest)
		return
	}
	logs, err := p.GetContainerLogs(req.Context(), req.PathValue("namespace"), req.PathValue("pod"), req.PathValue("container"), o)
	if err != nil {
		code := http.StatusBadRequest
		if errdefs.IsNotFound(err) {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
		return
	}
	defer logs.Close()
	w.Header().Set("Content-Type", "text/plain")
	f, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := logs.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if f != nil {
				f.Flush() // followed logs reach the client as they come
			}
		}
		if err != nil {
			return
		}
	}
}

// logOptions reads the kubelet's query (v1.PodLogOptions' fields).
func logOptions(q url.Values) (api.ContainerLogOpts, error) {
	var o api.ContainerLogOpts
	var errs []error
	flag := func(name string) bool {
		v := q.Get(name)
		if v == "" {
			return false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: not a boolean", name, v))
		}
		return b
	}
	num := func(name string) int {
		v := q.Get(name)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("%s=%q: not a non-negative integer", name, v))
		}
		return n
	}
	o.Follow, o.Previous, o.Timestamps = flag("follow"), flag("previous"), flag("timestamps")
	o.Tail, o.LimitBytes, o.SinceSeconds = num("tailLines"), num("limitBytes"), num("sinceSeconds")
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("sinceTime=%q: not an RFC 3339 time", v))
		}
		o.SinceTime = t
	}
	return o, errors.Join(errs...)
}

// runtimeErr turns the runtime's gRPC error into the kubelet API's: its
// message alone, not found kept apart from the rest.
func runtimeErr(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.NotFound {
		return errdefs.NotFound(st.Message())
	}
	return errdefs.InvalidInput(st.Message())
}

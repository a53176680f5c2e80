package node

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/podspec"
	"github.com/k3sm-dev/k3sm/internal/runtime/client"
)

// logsRuntime answers GetLogs with data, or with err before any data.
type logsRuntime struct {
	runtimev1.RuntimeClient
	data []string
	err  error
	got  *runtimev1.GetLogsRequest
}

func (r *logsRuntime) GetLogs(_ context.Context, in *runtimev1.GetLogsRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[runtimev1.GetLogsResponse], error) {
	r.got = in
	return &logsStream{data: r.data, err: r.err}, nil
}

type logsStream struct {
	grpc.ClientStream
	data []string
	err  error
}

func (s *logsStream) Recv() (*runtimev1.GetLogsResponse, error) {
	if s.err != nil {
		return nil, s.err
	}
	if len(s.data) == 0 {
		return nil, io.EOF
	}
	d := s.data[0]
	s.data = s.data[1:]
	return &runtimev1.GetLogsResponse{Data: []byte(d)}, nil
}

// kubectl logs prints what the node's log endpoint writes on a refusal:
// it must be the runtime's reason alone, as the kubelet writes it, not
// Virtual Kubelet's prefix and a gRPC status ("error getting container
// logs?): rpc error: code = ...").
func TestContainerLogsAsTheKubelet(t *testing.T) {
	rt := &logsRuntime{}
	p := newProvider(&client.Client{Runtime: rt}, podspec.New(podspec.Config{}), "127.0.0.1", nil, quiet(), false)
	p.byName[key("ns", "web")] = types.UID("u1")
	p.pods["u1"] = &podState{known: true}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", p.containerLogs)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	waiting := `container "app" in pod "web" is waiting to start: CrashLoopBackOff`
	rt.err = status.Error(codes.FailedPrecondition, waiting)
	if code, body := get("/containerLogs/ns/web/app"); code != http.StatusBadRequest || strings.TrimSpace(body) != waiting {
		t.Errorf("a waiting container: %d %q, want 400 %q", code, body, waiting)
	}
	rt.err = status.Error(codes.NotFound, `container "nope" is not in pod "web"`)
	if code, body := get("/containerLogs/ns/web/nope"); code != http.StatusNotFound || strings.TrimSpace(body) != `container "nope" is not in pod "web"` {
		t.Errorf("an unknown container: %d %q", code, body)
	}
	if code, body := get("/containerLogs/ns/other/app"); code != http.StatusNotFound || !strings.Contains(body, "ns/other") || strings.Contains(body, "rpc error") {
		t.Errorf("an unknown pod: %d %q", code, body)
	}

	// The query is the kubelet's: PodLogOptions.
	rt.err, rt.data = nil, []string{"one\n", "two\n"}
	if code, body := get("/containerLogs/ns/web/app?previous=true&tailLines=2&timestamps=true&limitBytes=100"); code != http.StatusOK || body != "one\ntwo\n" {
		t.Errorf("logs: %d %q", code, body)
	}
	if g := rt.got; !g.GetPrevious() || g.GetTailLines() != 2 || !g.GetTimestamps() || g.GetLimitBytes() != 100 || g.GetContainer() != "app" || g.GetPodUid() != "u1" {
		t.Errorf("request to the runtime: %v", g)
	}
	if code, body := get("/containerLogs/ns/web/app?tailLines=x"); code != http.StatusBadRequest || !strings.Contains(body, "unable to decode query") {
		t.Errorf("a bad query: %d %q", code, body)
	}
}

package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/moby/moby/client"
)

// SaveImages writes refs from the engine to w in `docker save` format. A
// ref the engine lacks is named before anything is written.
func (c *Client) SaveImages(ctx context.Context, refs []string, w io.Writer) error {
	for _, ref := range refs {
		ok, err := c.ImageExists(ctx, ref)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("no image %s in the Docker engine", ref)
		}
	}
	rc, err := c.api.ImageSave(ctx, refs)
	if err != nil {
		return fmt.Errorf("save %s: %w", strings.Join(refs, " "), err)
	}
	defer rc.Close()
	if _, err := io.Copy(w, rc); err != nil {
		return fmt.Errorf("save %s: %w", strings.Join(refs, " "), err)
	}
	return nil
}

// LoadImages loads a `docker save` stream into the engine and returns the
// images it named as loaded.
func (c *Client) LoadImages(ctx context.Context, r io.Reader) ([]string, error) {
	res, err := c.api.ImageLoad(ctx, r, client.ImageLoadWithQuiet(true))
	if err != nil {
		return nil, fmt.Errorf("docker load: %w", err)
	}
	defer res.Close()
	var loaded []string
	dec := json.NewDecoder(res)
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return loaded, fmt.Errorf("docker load: %w", err)
		}
		if msg.Error != "" || msg.ErrorDetail.Message != "" {
			return loaded, fmt.Errorf("docker load: %s", strings.TrimSpace(msg.Error+" "+msg.ErrorDetail.Message))
		}
		if ref, ok := strings.CutPrefix(strings.TrimSpace(msg.Stream), "Loaded image: "); ok {
			loaded = append(loaded, ref)
		}
	}
	return loaded, nil
}

// ImageTags lists the engine's tags in repository repo (e.g. klimax/node),
// sorted.
func (c *Client) ImageTags(ctx context.Context, repo string) ([]string, error) {
	res, err := c.api.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).Add("reference", repo)})
	if err != nil {
		return nil, fmt.Errorf("list images of %s: %w", repo, err)
	}
	var tags []string
	for _, im := range res.Items {
		for _, t := range im.RepoTags {
			if strings.HasPrefix(t, repo+":") {
				tags = append(tags, t)
			}
		}
	}
	slices.Sort(tags)
	return tags, nil
}

package imagetest

import (
	"io"
	"log"
)

type ioReadCloser = io.ReadCloser

type nopCloser struct{ io.Reader }

func (nopCloser) Close() error { return nil }

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

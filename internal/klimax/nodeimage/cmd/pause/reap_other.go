//go:build !unix

package main

func reap() {}

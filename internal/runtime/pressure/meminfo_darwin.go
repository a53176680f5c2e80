//go:build darwin

package pressure

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// readMemory estimates what MemAvailable is on Linux from the VM counters
// sysctl exposes (host_statistics64 needs Mach calls): free, speculative
// and purgeable pages, and file-backed pageable pages (the page cache the
// kernel reclaims first). Wired, compressed and anonymous pages are not
// available.
func readMemory() (Memory, error) {
	total, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return Memory{}, fmt.Errorf("sysctl hw.memsize: %w", err)
	}
	page, err := unix.SysctlUint32("vm.pagesize")
	if err != nil {
		return Memory{}, fmt.Errorf("sysctl vm.pagesize: %w", err)
	}
	var pages [4]uint32
	for i, name := range []string{"vm.page_free_count", "vm.page_speculative_count", "vm.page_purgeable_count", "vm.page_pageable_external_count"} {
		if pages[i], err = unix.SysctlUint32(name); err != nil {
			return Memory{}, fmt.Errorf("sysctl %s: %w", name, err)
		}
	}
	return darwinMemory(total, page, pages), nil
}

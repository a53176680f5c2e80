package dataplane

import (
	"fmt"
	"io"
	"log/slog"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// newUTUN makes the mesh device on a new utun (the kernel picks its
// number), logging wireguard-go's errors to log.
func newUTUN(log *slog.Logger) func(mtu int) (wgDevice, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(mtu int) (wgDevice, error) {
		t, err := tun.CreateTUN("utun", mtu)
		if err != nil {
			return nil, err
		}
		name, err := t.Name()
		if err != nil {
			t.Close()
			return nil, err
		}
		logger := &device.Logger{
			Verbosef: device.DiscardLogf,
			Errorf: func(format string, args ...any) {
				log.Warn("mesh device", "device", name, "err", fmt.Sprintf(format, args...))
			},
		}
		return &utunDevice{Device: device.NewDevice(t, conn.NewDefaultBind(), logger), name: name}, nil
	}
}

type utunDevice struct {
	*device.Device
	name string
}

func (u *utunDevice) Name() string { return u.name }

// SetKey sets the key directly, not through IpcSet: no text of it is made.
func (u *utunDevice) SetKey(k PrivateKey) error {
	return u.Device.SetPrivateKey(device.NoisePrivateKey(k))
}

func (u *utunDevice) IpcGet(w io.Writer) error { return u.Device.IpcGetOperation(w) }

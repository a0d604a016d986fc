package httpapi

import (
	"net/url"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
	"github.com/labstack/echo/v4"
)

// A submitted report's routes: its view, and its cancellation.

// reportKey is the :key of a report's route: its idempotency key,
// unescaped, 1 to resource.MaxKeyBytes bytes. The router matches the path
// as sent (escaped) only when it holds an escape that decoding changes
// ("%2F"), and the decoded path otherwise, so the key is unescaped here
// only in the first case: unescaping a decoded "50%" again refused it, and
// turned a key "a%2Fb" into "a/b".
func reportKey(c echo.Context) (string, error) {
	key, err := c.Param("key"), error(nil)
	if c.Request().URL.RawPath != "" {
		key, err = url.PathUnescape(key)
	}
	if err != nil || key == "" || len(key) > resource.MaxKeyBytes {
		return "", fleet.Errorf(wire.CodeInvalid, "a report's key is 1 to %d bytes, escaped in the path", resource.MaxKeyBytes)
	}
	return key, nil
}

func (s *Server) report(c echo.Context) error {
	key, err := reportKey(c)
	if err != nil {
		return err
	}
	return reply(c)(s.host.Views().Report(c.Request().Context(), key))
}

func (s *Server) cancelReport(c echo.Context) error {
	key, err := reportKey(c)
	if err != nil {
		return err
	}
	if err := emptyBody(c); err != nil {
		return err
	}
	return reply(c)(s.host.Operator().CancelReport(c.Request().Context(), key, ""))
}

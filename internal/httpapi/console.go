package httpapi

import (
	"crypto/rand"
	"embed"
	"encoding/base64"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

// The console is a static page (embedded, no build step) that calls the
// admin API with a session cookie instead of a bearer credential. The
// credential is sent once, to sign in, and never stored by the browser.

//go:embed console
var consoleFiles embed.FS

const (
	sessionCookie = "fleet_console"
	// sessionLifetime bounds a forgotten tab's access.
	sessionLifetime = 12 * time.Hour
	// maxSessions bounds memory; signing in needs the operator credential,
	// so only an operator can fill it, and the oldest session goes first.
	maxSessions = 1024
)

type session struct {
	caller  fleet.Caller
	expires time.Time
}

// sessions are held in memory only: a host restart signs everyone out,
// which is the safe direction.
type sessions struct {
	mu  sync.Mutex
	all map[string]session
}

func (s *sessions) add(caller fleet.Caller, now time.Time) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := base64.RawURLEncoding.EncodeToString(raw)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.all == nil {
		s.all = map[string]session{}
	}
	oldest, oldestAt := "", now.Add(sessionLifetime+time.Hour)
	for t, sess := range s.all {
		if now.After(sess.expires) {
			delete(s.all, t)
		} else if sess.expires.Before(oldestAt) {
			oldest, oldestAt = t, sess.expires
		}
	}
	if len(s.all) >= maxSessions {
		delete(s.all, oldest)
	}
	s.all[token] = session{caller: caller, expires: now.Add(sessionLifetime)}
	return token, nil
}

func (s *sessions) get(token string, now time.Time) (fleet.Caller, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.all[token]
	if !ok || now.After(sess.expires) {
		delete(s.all, token)
		return fleet.Caller{}, false
	}
	return sess.caller, true
}

func (s *sessions) remove(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.all, token)
}

// AllowHosts names the host names (besides IP literals and localhost) the
// console answers to, e.g. the name of a reverse proxy in front of it.
func (s *Server) AllowHosts(names []string) {
	for _, n := range names {
		if n = strings.ToLower(strings.TrimSpace(n)); n != "" {
			s.consoleHosts[n] = true
		}
	}
}

// checkBrowser guards every cookie-authenticated request. The Host check
// defeats DNS rebinding (another site's name pointed at this address); the
// Origin check defeats cross-site requests that SameSite might not stop
// (older browsers, sibling subdomains).
func (s *Server) checkBrowser(r *http.Request) error {
	name := r.Host
	if h, _, err := net.SplitHostPort(r.Host); err == nil {
		name = h
	}
	name = strings.ToLower(strings.Trim(name, "[]"))
	if net.ParseIP(name) == nil && name != "localhost" && !s.consoleHosts[name] {
		return fleet.Errorf(wire.CodeForbidden, "the console does not answer to host %.100q; serve --console-host %.100s allows it", r.Host, name)
	}
	origin := r.Header.Get("Origin")
	if origin != "" {
		u, err := url.Parse(origin)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return fleet.Errorf(wire.CodeForbidden, "cross-origin console request from %.100q refused", origin)
		}
		return nil
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		// Browsers send Origin on every cross-site write; a write without
		// one must at least say it came from this page.
		if site := r.Header.Get("Sec-Fetch-Site"); site != "same-origin" {
			return fleet.Errorf(wire.CodeForbidden, "a console write must come from the console page (no Origin header)")
		}
	}
	return nil
}

// sessionCaller authenticates a request by its console cookie.
func (s *Server) sessionCaller(c echo.Context) (fleet.Caller, bool, error) {
	cookie, err := c.Cookie(sessionCookie)
	if err != nil || cookie.Value == "" {
		return fleet.Caller{}, false, nil
	}
	if err := s.checkBrowser(c.Request()); err != nil {
		return fleet.Caller{}, true, err
	}
	caller, ok := s.sessions.get(cookie.Value, time.Now())
	if !ok {
		return fleet.Caller{}, true, fleet.Errorf(wire.CodeUnauthorized, "the console session has expired; sign in again")
	}
	// A session is only as good as the credential it signed in with: once
	// that is rotated or revoked (on any host), the session ends too.
	if role, err := s.host.Access().InForce(c.Request().Context(), caller); err != nil || role != access.RoleOperator {
		if err != nil && fleet.ErrorCode(err) != wire.CodeUnauthorized {
			return fleet.Caller{}, true, err
		}
		s.sessions.remove(cookie.Value)
		return fleet.Caller{}, true, fleet.Errorf(wire.CodeUnauthorized, "the credential this console session signed in with was rotated or revoked; sign in again")
	}
	return caller, true, nil
}

func (s *Server) routeConsole(e *echo.Echo) {
	static, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	assets := http.FileServer(http.FS(static))
	page := func(c echo.Context) error {
		h := c.Response().Header()
		// Only this host's own scripts and styles, never framed.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		return nil
	}
	e.GET("/", func(c echo.Context) error {
		page(c)
		data, err := consoleFiles.ReadFile("console/index.html")
		if err != nil {
			return err
		}
		return c.HTMLBlob(http.StatusOK, data)
	})
	e.GET("/console/*", func(c echo.Context) error {
		page(c)
		http.StripPrefix("/console", assets).ServeHTTP(c.Response(), c.Request())
		return nil
	})
	// Browsers ask for /favicon.ico whatever the page says; the icon is the
	// console's SVG.
	e.GET("/favicon.ico", func(c echo.Context) error {
		data, err := consoleFiles.ReadFile("console/favicon.svg")
		if err != nil {
			return err
		}
		c.Response().Header().Set("Cache-Control", "max-age=86400")
		return c.Blob(http.StatusOK, "image/svg+xml", data)
	})
	e.GET("/console/session", s.consoleWhoAmI)
	e.POST("/console/session", s.consoleSignIn)
	e.DELETE("/console/session", s.consoleSignOut)
}

func (s *Server) consoleWhoAmI(c echo.Context) error {
	caller, present, err := s.sessionCaller(c)
	if err != nil {
		return err
	}
	if !present {
		return fleet.Errorf(wire.CodeUnauthorized, "not signed in")
	}
	return c.JSON(http.StatusOK, map[string]string{"caller": caller.ID})
}

func (s *Server) consoleSignIn(c echo.Context) error {
	if err := s.checkBrowser(c.Request()); err != nil {
		return err
	}
	data, err := readSignIn(c)
	if err != nil {
		return err
	}
	var req struct {
		Credential string `json:"credential"`
	}
	if err := resource.DecodeStrict(data, &req); err != nil {
		return err
	}
	token := strings.TrimSpace(req.Credential)
	if token == "" {
		return fleet.Errorf(wire.CodeInvalid, "credential is required")
	}
	// The credential is looked up before the throttle has its say: a
	// lookup is a hash in memory, and the operator's own credential must
	// get in however many failures others have spent (README, "The
	// console"). Only a failure is throttled.
	caller, role, err := s.host.Access().Authenticate(c.Request().Context(), token)
	if err == nil && role != access.RoleOperator {
		err = fleet.Errorf(wire.CodeForbidden, "the console needs the operator credential, not a %s one", role)
	}
	if err != nil {
		if code := fleet.ErrorCode(err); code == wire.CodeUnauthorized || code == wire.CodeForbidden {
			if throttled := s.signIns.check(c); throttled != nil {
				s.host.Metrics().SignIn("throttled")
				return throttled
			}
			s.signIns.failed(c)
			s.host.Metrics().SignIn("failed")
			s.log.Warn("console sign-in refused", "remote", c.Request().RemoteAddr, "code", code)
		}
		return err
	}
	s.host.Metrics().SignIn("ok")
	session, err := s.sessions.add(caller, time.Now())
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{
		Name: sessionCookie, Value: session, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.Request().TLS != nil || c.Request().Header.Get("X-Forwarded-Proto") == "https",
	})
	s.log.Info("console sign-in", "caller", caller.ID, "remote", c.Request().RemoteAddr)
	return c.JSON(http.StatusOK, map[string]string{"caller": caller.ID})
}

func (s *Server) consoleSignOut(c echo.Context) error {
	if err := s.checkBrowser(c.Request()); err != nil {
		return err
	}
	if cookie, err := c.Cookie(sessionCookie); err == nil {
		s.sessions.remove(cookie.Value)
	}
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) receiptCheck(c echo.Context) error {
	id, err := receiptParam(c)
	if err != nil {
		return err
	}
	check, err := s.host.Views().CheckReceipt(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, check)
}

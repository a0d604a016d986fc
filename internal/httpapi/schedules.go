package httpapi

import (
	"context"

	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// scheduleRoutes serves the recurring reports under the operator's group.
func (s *Server) scheduleRoutes(a *echo.Group) {
	a.GET("/schedules", s.schedules)
	a.POST("/schedules", s.addSchedule)
	a.POST("/schedules/:name/pause", s.changeSchedule(func(ctx context.Context, name string) (wire.Schedule, error) {
		return s.host.Schedules().SetPaused(ctx, name, true)
	}))
	a.POST("/schedules/:name/resume", s.changeSchedule(func(ctx context.Context, name string) (wire.Schedule, error) {
		return s.host.Schedules().SetPaused(ctx, name, false)
	}))
	a.DELETE("/schedules/:name", s.changeSchedule(s.host.Schedules().Remove))
}

func (s *Server) schedules(c echo.Context) error {
	return reply(c)(s.host.Schedules().List(c.Request().Context()))
}

func (s *Server) addSchedule(c echo.Context) error {
	var req wire.ScheduleRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Schedules().Create(c.Request().Context(), req))
}

// changeSchedule serves a bodiless change of the :name schedule.
func (s *Server) changeSchedule(change func(ctx context.Context, name string) (wire.Schedule, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := emptyBody(c); err != nil {
			return err
		}
		name := c.Param("name")
		if name == "" || len(name) > 64 {
			return fleet.Errorf(wire.CodeInvalid, "a schedule's name is 1 to 64 characters")
		}
		return reply(c)(change(c.Request().Context(), name))
	}
}

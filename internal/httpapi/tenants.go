package httpapi

import (
	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/host/tenants"
	"github.com/fleet/fleet/internal/wire"
)

func (s *Server) tenants(c echo.Context) error {
	return reply(c)(tenants.List(c.Request().Context(), s.host.DB()))
}

func (s *Server) addTenant(c echo.Context) error {
	var req wire.TenantRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Tenants().Create(c.Request().Context(), req))
}

func (s *Server) tenantAllowance(c echo.Context) error {
	name := c.Param("name")
	if err := budget.ValidateTenantName(name); err != nil {
		return err
	}
	var req wire.TenantAllowanceRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Tenants().SetAllowance(c.Request().Context(), name, req))
}

func (s *Server) tenantWeight(c echo.Context) error {
	name := c.Param("name")
	if err := budget.ValidateTenantName(name); err != nil {
		return err
	}
	var req wire.TenantWeightRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Tenants().SetWeight(c.Request().Context(), name, req))
}

-- An agent's own cap: a worker credential may carry an allowance, fixed
-- when it is added, below its tenant's and the fleet's; its figures are
-- what the jobs it admitted spent and hold. A job names the credential
-- whose allowance holds part of its reservation ('' for none).
ALTER TABLE credentials ADD COLUMN allowance INTEGER CHECK (allowance IS NULL OR allowance >= 0);
ALTER TABLE credentials ADD COLUMN spent INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0);
ALTER TABLE credentials ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0);
ALTER TABLE jobs ADD COLUMN reserve_credential TEXT NOT NULL DEFAULT '';

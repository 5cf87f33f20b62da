-- observatory: an astronomy observatory's telescopes, observers, targets, observing nights and exposures (UPPERCASE abbreviated names without separators, text codes, composite key (telescope, night), self-referencing host object, ISO 'T' timestamps, 'Y'/'N' flags, NULL = not yet reduced)
CREATE TABLE SCOPE (SCOPECD TEXT PRIMARY KEY, SCOPENM TEXT NOT NULL, APERMM INTEGER, MOUNTTYP TEXT, ROBOTIC TEXT, FIRSTLIGHT TEXT);
CREATE TABLE OBSVR (INITIALS TEXT PRIMARY KEY, FULLNM TEXT NOT NULL, AFFIL TEXT);
CREATE TABLE TGT (TGTID TEXT PRIMARY KEY, COMMONNM TEXT NOT NULL, TGTCLASS TEXT, VMAG REAL, HOSTTGT TEXT REFERENCES TGT(TGTID), CONSTEL TEXT);
CREATE TABLE NIGHT (SCOPECD TEXT NOT NULL REFERENCES SCOPE(SCOPECD), NIGHTDT TEXT NOT NULL, OBSVR TEXT REFERENCES OBSVR(INITIALS), SEEINGAS REAL, CLOUDPCT INTEGER, PRIMARY KEY (SCOPECD, NIGHTDT));
CREATE TABLE EXPO (EXPNO INTEGER PRIMARY KEY, SCOPECD TEXT NOT NULL, NIGHTDT TEXT NOT NULL, TGTID TEXT REFERENCES TGT(TGTID), FILT TEXT, EXPSEC REAL, UTSTART TEXT, REDUCEDTS TEXT, FOREIGN KEY (SCOPECD, NIGHTDT) REFERENCES NIGHT(SCOPECD, NIGHTDT));
INSERT INTO SCOPE VALUES
  ('T60', 'Cassegrain 60', 600, 'equatorial', 'N', '1998-10-10'),
  ('T40', 'Big Dome', 400, 'equatorial', 'N', '2009-05-12'),
  ('R35', 'Robo 35', 350, 'fork', 'Y', '2021-11-02'),
  ('T28', 'West Pier C11', 280, 'equatorial', 'Y', '2015-09-01'),
  ('T10', 'Solar Refractor', 100, 'alt-az', 'N', '2018-03-20'),
  ('T20', 'Student Refractor', 200, 'equatorial', 'N', '2012-02-01'),
  ('T50', 'Spectro 50', 500, 'alt-az', 'Y', '2023-08-15'),
  ('T15', 'Comet Hunter', 150, 'alt-az', 'N', '2005-11-30');
INSERT INTO OBSVR VALUES
  ('AK', 'Amara Kone', 'university'), ('JB', 'Jonas Berg', 'amateur club'), ('MT', 'Mei Tanaka', 'university'),
  ('RP', 'Rosa Pinto', 'amateur club'), ('DW', 'Dan Webb', 'visiting'), ('LF', 'Lena Fischer', 'amateur club'),
  ('KO', 'Kwame Osei', 'university'), ('SG', 'Sofia Greco', 'visiting');
INSERT INTO TGT VALUES
  ('M31', 'Andromeda Galaxy', 'galaxy', 3.4, NULL, 'And'),
  ('M32', 'M32', 'galaxy', 8.1, 'M31', 'And'),
  ('M110', 'M110', 'galaxy', 8.5, 'M31', 'And'),
  ('M42', 'Orion Nebula', 'nebula', 4.0, NULL, 'Ori'),
  ('M45', 'Pleiades', 'open cluster', 1.6, NULL, 'Tau'),
  ('ALCYONE', 'Alcyone', 'star', 2.9, 'M45', 'Tau'),
  ('M13', 'Hercules Cluster', 'globular cluster', 5.8, NULL, 'Her'),
  ('M57', 'Ring Nebula', 'planetary nebula', 8.8, NULL, 'Lyr'),
  ('JUP', 'Jupiter', 'planet', -2.5, NULL, NULL),
  ('IO', 'Io', 'moon', 5.0, 'JUP', NULL),
  ('EUROPA', 'Europa', 'moon', 5.3, 'JUP', NULL),
  ('SAT', 'Saturn', 'planet', 0.6, NULL, NULL),
  ('TITAN', 'Titan', 'moon', 8.2, 'SAT', NULL),
  ('M51', 'Whirlpool Galaxy', 'galaxy', 8.4, NULL, 'CVn'),
  ('NGC7000', 'North America Nebula', 'nebula', 4.2, NULL, 'Cyg'),
  ('SN2024AB', 'SN 2024ab', 'supernova', 14.2, 'M51', 'CVn'),
  ('SUN', 'Sun', 'star', -26.7, NULL, NULL);
INSERT INTO NIGHT VALUES
  ('T60', '2024-01-12', 'AK', 1.1, 10), ('T40', '2024-01-12', 'JB', 1.6, 10), ('R35', '2024-01-12', NULL, 1.4, 10),
  ('T60', '2024-01-19', 'MT', 0.9, 0), ('T28', '2024-01-19', NULL, 1.8, 5),
  ('T40', '2024-02-03', 'RP', 2.4, 40), ('T60', '2024-02-03', 'AK', 2.1, 40),
  ('T10', '2024-02-10', 'LF', NULL, 20),
  ('R35', '2024-02-15', NULL, 1.2, 0), ('T60', '2024-02-15', 'DW', 0.8, 0),
  ('T40', '2024-03-02', 'JB', 1.9, 60),
  ('T28', '2024-03-09', NULL, 1.5, 15), ('T60', '2024-03-09', 'MT', 1.0, 15),
  ('R35', '2024-03-30', NULL, 1.3, 5),
  ('T40', '2024-04-06', 'RP', 1.7, 25),
  ('T10', '2024-04-08', 'LF', NULL, 30);
INSERT INTO EXPO VALUES
  (1, 'T60', '2024-01-12', 'M31', 'L', 300, '2024-01-12T19:05:00', '2024-01-13T10:00:00'),
  (2, 'T60', '2024-01-12', 'M31', 'Ha', 600, '2024-01-12T19:12:00', '2024-01-13T10:20:00'),
  (3, 'T60', '2024-01-12', 'M32', 'V', 120, '2024-01-12T20:00:00', '2024-01-13T10:40:00'),
  (4, 'T40', '2024-01-12', 'M42', 'Ha', 180, '2024-01-12T21:30:00', '2024-01-14T09:00:00'),
  (5, 'T40', '2024-01-12', 'M42', 'OIII', 180, '2024-01-12T21:35:00', NULL),
  (6, 'R35', '2024-01-12', 'M45', 'L', 60, '2024-01-12T22:10:00', '2024-01-13T02:00:00'),
  (7, 'R35', '2024-01-12', 'JUP', 'R', 0.5, '2024-01-12T18:30:00', '2024-01-12T23:00:00'),
  (8, 'T60', '2024-01-19', 'M42', 'L', 120, '2024-01-19T20:15:00', '2024-01-20T11:00:00'),
  (9, 'T60', '2024-01-19', 'M110', 'L', 300, '2024-01-19T19:10:00', '2024-01-22T15:30:00'),
  (10, 'T28', '2024-01-19', 'JUP', 'G', 0.3, '2024-01-19T18:45:00', '2024-01-19T22:00:00'),
  (11, 'T28', '2024-01-19', 'IO', 'V', 2, '2024-01-19T18:50:00', NULL),
  (12, 'T40', '2024-02-03', 'M45', 'B', 90, '2024-02-03T19:40:00', '2024-02-05T08:00:00'),
  (13, 'T60', '2024-02-03', 'M51', 'L', 600, '2024-02-04T01:30:00', '2024-02-04T12:00:00'),
  (14, 'T10', '2024-02-10', 'SUN', 'Ha', 0.01, '2024-02-10T11:00:00', '2024-02-10T15:00:00'),
  (15, 'T10', '2024-02-10', 'SUN', 'L', 0.002, '2024-02-10T11:05:00', '2024-02-10T15:10:00'),
  (16, 'R35', '2024-02-15', 'M51', 'R', 300, '2024-02-16T00:40:00', '2024-02-16T06:00:00'),
  (17, 'R35', '2024-02-15', 'M51', 'G', 300, '2024-02-16T00:46:00', '2024-02-16T06:05:00'),
  (18, 'R35', '2024-02-15', 'M51', 'B', 300, '2024-02-16T00:52:00', NULL),
  (19, 'T60', '2024-02-15', 'M13', 'L', 240, '2024-02-16T03:20:00', '2024-02-17T09:00:00'),
  (20, 'T60', '2024-02-15', 'M57', 'OIII', 480, '2024-02-16T04:10:00', '2024-02-17T09:30:00'),
  (21, 'T40', '2024-03-02', 'M42', 'L', 60, '2024-03-02T19:20:00', NULL),
  (22, 'T28', '2024-03-09', 'SN2024AB', 'L', 600, '2024-03-10T01:00:00', '2024-03-10T09:00:00'),
  (23, 'T28', '2024-03-09', 'SN2024AB', 'V', 600, '2024-03-10T01:11:00', '2024-03-10T09:15:00'),
  (24, 'T60', '2024-03-09', 'SN2024AB', 'V', 300, '2024-03-10T01:30:00', '2024-03-10T08:30:00'),
  (25, 'T60', '2024-03-09', 'M57', 'Ha', 600, '2024-03-10T03:40:00', NULL),
  (26, 'T60', '2024-03-09', 'M51', 'L', 900, '2024-03-10T00:10:00', '2024-03-11T14:00:00'),
  (27, 'R35', '2024-03-30', 'M13', 'R', 180, '2024-03-31T02:00:00', '2024-03-31T07:00:00'),
  (28, 'R35', '2024-03-30', 'M57', 'Ha', 900, '2024-03-31T03:00:00', NULL),
  (29, 'R35', '2024-03-30', 'SN2024AB', 'V', 600, '2024-03-30T23:40:00', '2024-03-31T07:30:00'),
  (30, 'T40', '2024-04-06', 'M13', 'L', 240, '2024-04-07T01:10:00', '2024-04-08T10:00:00'),
  (31, 'T40', '2024-04-06', 'M57', 'L', 300, '2024-04-07T02:05:00', NULL),
  (32, 'T10', '2024-04-08', 'SUN', 'L', 0.001, '2024-04-08T18:20:00', '2024-04-08T22:00:00'),
  (33, 'T10', '2024-04-08', 'SUN', 'Ha', 0.02, '2024-04-08T18:25:00', NULL),
  (34, 'T60', '2024-01-12', 'JUP', 'V', 0.2, '2024-01-12T18:40:00', '2024-01-13T09:00:00'),
  (35, 'T28', '2024-01-19', 'EUROPA', 'V', 2, '2024-01-19T18:55:00', '2024-01-20T08:00:00');

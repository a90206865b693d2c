-- Run once by the MariaDB image on an empty data volume, after it created the
-- API database and the cellsight user (MARIADB_DATABASE / MARIADB_USER).
CREATE DATABASE IF NOT EXISTS cell1 CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS cell2 CHARACTER SET utf8mb4;
GRANT ALL PRIVILEGES ON cell1.* TO 'cellsight'@'%';
GRANT ALL PRIVILEGES ON cell2.* TO 'cellsight'@'%';
FLUSH PRIVILEGES;

# install_units.cmake - `cmake --install` of the systemd units and of
# /etc/default/ferry-agent, for the prefix given at install time (see
# CMakeLists.txt). FERRYFS_DIST_SRC, FERRYFS_DIST_BIN and
# FERRYFS_BINDIR_REL are set by the install(CODE) before this script.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(unitdir /lib/systemd/system)
  set(sysconfdir /etc)
else()
  set(unitdir ${CMAKE_INSTALL_PREFIX}/lib/systemd/system)
  set(sysconfdir ${CMAKE_INSTALL_PREFIX}/etc)
endif()
set(FERRYFS_SYSCONFDIR ${sysconfdir})
set(FERRYFS_BINDIR ${CMAKE_INSTALL_PREFIX}/${FERRYFS_BINDIR_REL})
foreach(unit ferry-agent@.service ferryfs-flush@.service)
  configure_file(${FERRYFS_DIST_SRC}/${unit}.in
    ${FERRYFS_DIST_BIN}/units/${unit} @ONLY)
  file(INSTALL ${FERRYFS_DIST_BIN}/units/${unit} DESTINATION ${unitdir}
    FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endforeach()
configure_file(${FERRYFS_DIST_SRC}/ferry-agent.default
  ${FERRYFS_DIST_BIN}/default/ferry-agent COPYONLY)
file(INSTALL ${FERRYFS_DIST_BIN}/default/ferry-agent
  DESTINATION ${sysconfdir}/default
  FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
